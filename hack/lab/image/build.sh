#!/usr/bin/env bash
# Build the lab guest image, or reuse the cached one, and print its
# directory on stdout (progress goes to stderr).
#
# The image is a stock Debian kernel (linux-image-<abi>-amd64, fetched with
# apt-get download and unpacked with dpkg -x, never installed on the host)
# plus an uncompressed newc cpio initramfs holding a debootstrap minbase
# root filesystem, the kernel modules the lab needs, and the overlay in
# image/overlay (the guest init and its configuration).
#
# Cache key: sha256 of this script, the package and module lists, the
# overlay, the suite and the resolved kernel package and version. A
# rerun with the same inputs prints the cached directory without building.
#
# Environment: PATHMEND_LAB_CACHE (cache root), PATHMEND_LAB_MIRROR,
# PATHMEND_LAB_SUITE, PATHMEND_LAB_KERNEL (a linux-image package name to
# use instead of the one linux-image-amd64 depends on), LAB_REBUILD=1.
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

IMAGE_SRC=$LAB_DIR/image

lab_host_packages "${LAB_HOST_PACKAGES[@]}"

# resolve_kernel prints "<package> <version>" of the stock amd64 kernel
# (not the cloud flavour: it lacks 9p).
resolve_kernel() {
	local pkg ver
	pkg=${PATHMEND_LAB_KERNEL:-}
	if [ -z "$pkg" ]; then
		pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
			awk '/Depends: linux-image-[0-9].*-amd64$/ { print $2; exit }')
	fi
	[ -n "$pkg" ] || return 1
	case $pkg in *cloud*) lab_die "$pkg is the cloud flavour, which has no 9p" ;; esac
	ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ { print $2 }')
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || return 1
	echo "$pkg $ver"
}

kernel=$(resolve_kernel || true)
if [ -z "$kernel" ]; then
	lab_apt_update
	kernel=$(resolve_kernel) || lab_die "cannot resolve the linux-image-*-amd64 package (apt lists empty?)"
fi
read -r KPKG KPKGVER <<<"$kernel"
KVER=${KPKG#linux-image-}

key=$(
	{
		echo "suite=$LAB_SUITE kernel=$KPKG=$KPKGVER"
		cat "$IMAGE_SRC/build.sh" "$LAB_DIR/rootfs.packages" "$LAB_DIR/modules.list"
		(cd "$IMAGE_SRC/overlay" && find . -type f | LC_ALL=C sort | while read -r f; do
			echo "$f"
			cat "$f"
		done)
	} | sha256sum | cut -c1-16
)
OUT=$LAB_CACHE/images/$KVER-$key

if [ -z "${LAB_REBUILD:-}" ] && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initramfs.cpio" ] && [ -s "$OUT/info" ]; then
	lab_step "Guest image cached: $OUT ($(awk -F= '/^size_human=/ { print $2 }' "$OUT/info"))"
	echo "$OUT"
	exit 0
fi

lab_need_root
t0=$(date +%s)
lab_step "Building guest image $KPKG $KPKGVER (key $key)"
mkdir -p "$LAB_CACHE/images" "$LAB_CACHE/debs"
WORK=$(mktemp -d "$LAB_CACHE/build.XXXXXX")
chmod 0755 "$WORK" # apt-get download hands the file to the _apt user
cleanup() {
	# debootstrap may leave proc mounted inside the tree on failure.
	umount -l "$WORK/rootfs/proc" 2>/dev/null || true
	umount -l "$WORK/rootfs/sys" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

# 1. The kernel package, unpacked beside the root fs.
lab_step "Fetching $KPKG=$KPKGVER"
(cd "$WORK" && timeout 600 apt-get download -qq -o APT::Sandbox::User=root "$KPKG=$KPKGVER" >&2) || lab_die "apt-get download $KPKG failed"
timeout 300 dpkg -x "$WORK"/"${KPKG}"_*.deb "$WORK/kernel"
# The package ships no modules.dep (its postinst runs depmod).
depmod -b "$WORK/kernel" "$KVER"
[ -s "$WORK/kernel/boot/vmlinuz-$KVER" ] || lab_die "no boot/vmlinuz-$KVER in $KPKG"

# 2. The root fs.
packages=$(grep -v '^[[:space:]]*\(#\|$\)' "$LAB_DIR/rootfs.packages" | paste -sd, -)
lab_step "debootstrap --variant=minbase $LAB_SUITE (+ $packages)"
t_db=$(date +%s)
if ! timeout 1200 debootstrap --variant=minbase --cache-dir="$LAB_CACHE/debs" \
	--include="$packages" "$LAB_SUITE" "$WORK/rootfs" "$LAB_MIRROR" >"$WORK/debootstrap.log" 2>&1; then
	tail -n 30 "$WORK/debootstrap.log" >&2
	[ -f "$WORK/rootfs/debootstrap/debootstrap.log" ] && tail -n 30 "$WORK/rootfs/debootstrap/debootstrap.log" >&2
	lab_die "debootstrap failed"
fi
t_db=$(($(date +%s) - t_db))
R=$WORK/rootfs

# 3. Only the modules the lab needs, with their dependency closure.
lab_step "Selecting kernel modules"
mods=$(grep -v '^[[:space:]]*\(#\|$\)' "$LAB_DIR/modules.list")
KMOD=$WORK/kernel/lib/modules/$KVER
mkdir -p "$R/lib/modules/$KVER"
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[ -f "$KMOD/$f" ] && cp "$KMOD/$f" "$R/lib/modules/$KVER/"
done
for m in $mods; do
	deps=$(modprobe -d "$WORK/kernel" -S "$KVER" --show-depends "$m" 2>&1) || lab_die "module $m: $deps"
	while read -r verb path _; do
		[ "$verb" = insmod ] || continue
		rel=${path#"$WORK/kernel"}
		mkdir -p "$R$(dirname "$rel")"
		cp -n "$WORK/kernel$rel" "$R$rel"
	done <<<"$deps"
done
depmod -b "$R" "$KVER"
nmods=$(find "$R/lib/modules/$KVER" -name '*.ko*' | wc -l)

# 4. Trim what a throwaway guest never reads, then lay the overlay.
rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bash-completion} "$R"/var/cache/apt/* \
	"$R"/var/lib/apt/lists/* "$R"/var/log/* "$R"/debootstrap "$R"/etc/machine-id
cp -a "$IMAGE_SRC/overlay/." "$R/"
chmod 0755 "$R/init"
echo pathmend-lab >"$R/etc/hostname"
printf '127.0.0.1\tlocalhost pathmend-lab\n' >"$R/etc/hosts"
# iptables: the legacy backend needs fewer modules than nft.
chroot "$R" update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null
[ -c "$R/dev/console" ] || mknod -m 600 "$R/dev/console" c 5 1
[ -c "$R/dev/null" ] || mknod -m 666 "$R/dev/null" c 1 3
echo "$KVER" >"$R/etc/pathmend-lab-kernel"

# 5. Pack.
lab_step "Packing initramfs (newc cpio)"
mkdir -p "$OUT.tmp"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$OUT.tmp/vmlinuz"
(cd "$R" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$OUT.tmp/initramfs.cpio"
t1=$(date +%s)
size=$(du -cb "$OUT.tmp/vmlinuz" "$OUT.tmp/initramfs.cpio" | awk 'END { print $1 }')
cat >"$OUT.tmp/info" <<INFO
kernel_package=$KPKG
kernel_package_version=$KPKGVER
kernel_release=$KVER
suite=$LAB_SUITE
key=$key
modules=$nmods
build_seconds=$((t1 - t0))
debootstrap_seconds=$t_db
size_bytes=$size
size_human=$(numfmt --to=iec "$size")
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
INFO
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
# One image per kernel release is enough: drop images of older inputs.
if [ -z "${PATHMEND_LAB_KEEP_IMAGES:-}" ]; then
	for old in "$LAB_CACHE/images/$KVER"-*; do
		[ "$old" = "$OUT" ] || rm -rf "$old"
	done
fi
lab_step "Guest image built in $((t1 - t0))s (debootstrap ${t_db}s): $(numfmt --to=iec "$size"), $nmods modules, kernel $KVER"
echo "$OUT"
