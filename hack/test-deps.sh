#!/usr/bin/env bash
# hack/test-deps.sh: the host tools `make test` needs, installed with
# apt-get when missing (as root; a bare Debian 12 has no xfsprogs). Without
# root it only says what is missing: the tests that need a tool then skip
# with its name (and fail under CI=true, where .ci/run installs everything).
#
# promtool (Debian package prometheus) is not installed here: that package
# is a Prometheus server whose service starts on a machine with systemd.
# .ci/run installs it; locally the alert unit tests skip without it.
set -euo pipefail
need=(mkfs.ext4:e2fsprogs resize2fs:e2fsprogs mkfs.xfs:xfsprogs xfs_growfs:xfsprogs
	losetup:mount mount:mount umount:mount blkid:util-linux)
missing=()
for pair in "${need[@]}"; do
	command -v "${pair%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "${pair%%:*}" >/dev/null 2>&1 ||
		missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
	echo "test-deps: missing ${missing[*]} (not root: not installing; the tests that need them skip)" >&2
	exit 0
fi
echo "test-deps: installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
