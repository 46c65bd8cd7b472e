#!/usr/bin/env bash
# Build the Kubernetes binaries of the kubelet lab, or reuse the cached
# ones, and print their directory on stdout (progress goes to stderr).
#
# kubelet and kube-apiserver are built from their Go modules at the
# release pinned in k8s/go.mod (its tool directives), with the staging
# modules replaced by their published releases of the same minor. Nothing
# prebuilt is downloaded. The binaries are static (CGO_ENABLED=0) and carry
# the release as their version, as a release build would report it.
#
# Cache: $LAB_CACHE/kubernetes/<release>-<key>, key = sha256 of this
# script, the module versions the k8s module selects (`go list -m all`:
# what the binaries are linked from, unchanged when only the lab's own
# programs in k8s/cmd change) and `go version`. A rerun with the same
# inputs prints the cached directory without building; LAB_REBUILD=1
# forces a build. Older builds of the same release are dropped.
#
# The build uses both cores for minutes: callers hold the lab lock
# (`flock /tmp/pathmend-lab.lock make kubelet-lab`).
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

KLAB_DIR=$LAB_DIR/kubelet
MOD=$KLAB_DIR/k8s
GO=${GO:-go}

release=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$MOD/go.mod")
[ -n "$release" ] || lab_die "no k8s.io/kubernetes requirement in $MOD/go.mod"
graph=$(cd "$MOD" && "$GO" list -m all) || lab_die "go list -m all in $MOD failed"
key=$(
	{
		cat "${BASH_SOURCE[0]}"
		echo "$graph"
		"$GO" version
	} | sha256sum | cut -c1-16
)
OUT=$LAB_CACHE/kubernetes/$release-$key
BINS=(kubelet kube-apiserver)

cached() {
	local b
	[ -s "$OUT/info" ] || return 1
	for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}

if [ -z "${LAB_REBUILD:-}" ] && cached; then
	lab_step "Kubernetes $release binaries cached: $OUT"
	echo "$OUT"
	exit 0
fi

major=${release#v}
minor=${major#*.}
major=${major%%.*}
minor=${minor%%.*}
pkgs=()
for b in "${BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$release -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

mkdir -p "$LAB_CACHE/kubernetes"
rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
lab_step "Building Kubernetes $release (${BINS[*]}) from its modules (key $key); minutes on 2 cores"
t0=$(date +%s)
(cd "$MOD" && CGO_ENABLED=0 timeout 3600 "$GO" build -trimpath -ldflags "$ldflags" -o "$OUT.tmp/" "${pkgs[@]}") ||
	lab_die "building Kubernetes $release failed"
t1=$(date +%s)
{
	echo "release=$release"
	echo "key=$key"
	echo "go=$("$GO" env GOVERSION)"
	echo "build_seconds=$((t1 - t0))"
	for b in "${BINS[@]}"; do echo "size_$b=$(stat -c %s "$OUT.tmp/$b")"; done
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$OUT.tmp/info"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
for old in "$LAB_CACHE/kubernetes/$release"-*; do
	[ "$old" = "$OUT" ] || rm -rf "$old"
done
lab_step "Kubernetes $release built in $((t1 - t0))s: $(for b in "${BINS[@]}"; do printf '%s %s ' "$b" "$(numfmt --to=iec "$(stat -c %s "$OUT/$b")")"; done)"
echo "$OUT"
