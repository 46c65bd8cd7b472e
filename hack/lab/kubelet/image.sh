#!/usr/bin/env bash
# Build the kubelet lab's guest image, or reuse the cached one, and print
# its directory on stdout (progress goes to stderr).
#
# The image is the lab's own guest image (hack/lab/image/build.sh) with one
# more cpio archive appended to its initramfs: the Debian packages in
# guest.packages (containerd, runc, etcd-server), fetched with apt-get
# download and unpacked with dpkg -x, never installed on the host. The
# kernel unpacks concatenated newc archives one after the other, so the
# shared image and its package list stay as they are. The directory also
# holds busybox (from busybox-static), which run.sh packs into the
# workload's container image.
#
# Cache: $LAB_CACHE/kubelet-lab/images/<base image>-<key>, key = sha256 of
# this script, guest.packages and the resolved package versions. Images of
# other keys are dropped. LAB_REBUILD=1 rebuilds.
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

KLAB_DIR=$LAB_DIR/kubelet
base=$("$LAB_DIR/image/build.sh")
mapfile -t pkgs < <(grep -v '^[[:space:]]*\(#\|$\)' "$KLAB_DIR/guest.packages")
pkgs+=(busybox-static)

# resolve prints "package=version" for every package, or fails.
resolve() {
	local p v
	for p in "${pkgs[@]}"; do
		v=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ { print $2 }')
		[ -n "$v" ] && [ "$v" != "(none)" ] || return 1
		echo "$p=$v"
	done
}
versions=$(resolve) || {
	lab_apt_update
	versions=$(resolve) || lab_die "cannot resolve ${pkgs[*]} (apt lists empty?)"
}
key=$({
	cat "${BASH_SOURCE[0]}" "$KLAB_DIR/guest.packages"
	echo "$versions"
} | sha256sum | cut -c1-16)
OUT=$LAB_CACHE/kubelet-lab/images/$(basename "$base")-$key

if [ -z "${LAB_REBUILD:-}" ] && [ -s "$OUT/info" ] && [ -s "$OUT/initramfs.cpio" ] && [ -x "$OUT/busybox" ]; then
	lab_step "Kubelet lab image cached: $OUT"
	echo "$OUT"
	exit 0
fi

lab_need_root
t0=$(date +%s)
lab_step "Building the kubelet lab image: $(basename "$base") + $(echo "$versions" | xargs)"
DEBS=$LAB_CACHE/kubelet-lab/debs
mkdir -p "$DEBS" "$LAB_CACHE/kubelet-lab/images"
chmod 0755 "$DEBS" # apt-get download hands the file to the _apt user
WORK=$(mktemp -d "$LAB_CACHE/kubelet-lab/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for pv in $versions; do
	p=${pv%%=*} v=${pv#*=}
	# apt-get download names files package_version-with-%3a-for-colons_arch.deb.
	ls "$DEBS/${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1 ||
		(cd "$DEBS" && timeout 600 apt-get download -qq -o APT::Sandbox::User=root "$pv" >&2) ||
		lab_die "apt-get download $pv failed"
done

R=$WORK/layer
mkdir -p "$R"
for pv in $versions; do
	p=${pv%%=*} v=${pv#*=}
	[ "$p" = busybox-static ] && continue
	timeout 300 dpkg -x "$DEBS/${p}_${v//:/%3a}_"*.deb "$R"
done
rm -rf "$R"/usr/share/{doc,man,lintian,bash-completion,zsh} "$R"/lib/systemd "$R"/etc/init.d "$R"/etc/default
# The v1 shims: containerd 1.6 starts io.containerd.runc.v2.
rm -f "$R"/usr/bin/containerd-shim "$R"/usr/bin/containerd-shim-runc-v1
# The base image has merged /usr (/bin, /sbin, /lib are symlinks into
# /usr). The kernel replaces an existing entry of another type when it
# unpacks a later archive, so a directory /lib in the layer would take
# the base's /lib symlink, and every shared library with it: move such
# trees under /usr and leave no empty directory behind.
find "$R" -depth -mindepth 1 -type d -empty -delete
for d in bin sbin lib lib64; do
	if [ -d "$R/$d" ]; then
		mkdir -p "$R/usr/$d"
		cp -a "$R/$d/." "$R/usr/$d/"
		rm -rf "${R:?}/$d"
	fi
done
for b in usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr usr/sbin/runc usr/bin/etcd; do
	[ -x "$R/$b" ] || lab_die "no $b in the unpacked packages"
done

mkdir -p "$OUT.tmp"
timeout 300 dpkg -x "$DEBS/busybox-static_$(echo "$versions" | awk -F= '$1 == "busybox-static" { gsub(":", "%3a", $2); print $2 }')_"*.deb "$WORK/busybox"
cp "$WORK/busybox/bin/busybox" "$OUT.tmp/busybox"
ln "$base/vmlinuz" "$OUT.tmp/vmlinuz" 2>/dev/null || cp "$base/vmlinuz" "$OUT.tmp/vmlinuz"
lab_step "Packing the layer and appending it to $(basename "$base")/initramfs.cpio"
{
	cat "$base/initramfs.cpio"
	# No "." entry: it would set the mode of / to the build directory's.
	(cd "$R" && find . -mindepth 1 -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet)
} >"$OUT.tmp/initramfs.cpio"
t1=$(date +%s)
{
	echo "base=$base"
	echo "key=$key"
	echo "packages=$(echo "$versions" | xargs)"
	echo "layer_bytes=$(du -sb "$R" | cut -f1)"
	echo "size_bytes=$(stat -c %s "$OUT.tmp/initramfs.cpio")"
	echo "build_seconds=$((t1 - t0))"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$OUT.tmp/info"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
for old in "$LAB_CACHE"/kubelet-lab/images/*; do
	[ "$old" = "$OUT" ] || rm -rf "$old"
done
lab_step "Kubelet lab image built in $((t1 - t0))s: layer $(numfmt --to=iec "$(du -sb "$R" | cut -f1)"), initramfs $(numfmt --to=iec "$(stat -c %s "$OUT/initramfs.cpio")")"
echo "$OUT"
