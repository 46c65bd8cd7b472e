# shellcheck shell=bash
# Host-side helpers shared by the lab scripts. Sourced, never executed.
#
# Everything the lab writes outside the repository goes under LAB_CACHE
# (default ${XDG_CACHE_HOME:-$HOME/.cache}/pathmend-lab): built guest images
# keyed by a hash of their inputs, the debootstrap package cache, and the
# per-run share directories.

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LAB_DIR/../.." && pwd)
LAB_CACHE=${PATHMEND_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pathmend-lab}
# LAB_OUT holds the per-run share directories and timings.tsv; two lab
# commands run at once from one checkout need one each.
LAB_OUT=${LAB_OUT:-$LAB_DIR/out}
LAB_SUITE=${PATHMEND_LAB_SUITE:-bookworm}
LAB_MIRROR=${PATHMEND_LAB_MIRROR:-http://deb.debian.org/debian}
LAB_T0=${LAB_T0:-$(date +%s.%N)}
export LAB_T0

# lab_step prints a progress line with the seconds elapsed since the
# command started, so a slow step is visible as it happens.
lab_step() {
	printf '==> [%6.1fs] %s\n' "$(lab_elapsed)" "$*" >&2
}

lab_elapsed() {
	awk -v a="$LAB_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

lab_die() {
	printf 'lab: error: %s\n' "$*" >&2
	exit 1
}

# lab_need_root refuses to go on without root: debootstrap, mknod and the
# cpio ownership all need it.
lab_need_root() {
	[ "$(id -u)" = 0 ] || lab_die "the lab must run as root (debootstrap, device nodes)"
}

# lab_apt_update runs apt-get update once per hour at most: a fresh
# machine has empty package lists and apt-cache answers nothing before it.
lab_apt_update() {
	local stamp=$LAB_CACHE/apt-updated
	mkdir -p "$LAB_CACHE"
	if [ -z "$(find "$stamp" -mmin -60 2>/dev/null)" ] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
		lab_step "apt-get update"
		timeout 600 apt-get update -qq >"$LAB_CACHE/apt-update.log" 2>&1 || {
			tail -n 30 "$LAB_CACHE/apt-update.log" >&2
			lab_die "apt-get update failed"
		}
		touch "$stamp"
	fi
}

# lab_host_packages installs the host packages the lab needs that are
# missing. Each argument is command:package.
lab_host_packages() {
	local missing=() pair cmd pkg
	for pair in "$@"; do
		cmd=${pair%%:*}
		pkg=${pair#*:}
		command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	lab_need_root
	lab_apt_update
	lab_step "Installing host packages: ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >"$LAB_CACHE/apt-install.log" 2>&1; then
		tail -n 30 "$LAB_CACHE/apt-install.log" >&2
		lab_die "apt-get install ${missing[*]} failed"
	fi
}

# LAB_HOST_PACKAGES is every host command the lab uses and the Debian
# package that ships it.
LAB_HOST_PACKAGES=(
	qemu-system-x86_64:qemu-system-x86
	debootstrap:debootstrap
	cpio:cpio
	depmod:kmod
	sha256sum:coreutils
	timeout:coreutils
	awk:mawk
	dpkg-deb:dpkg
	gzip:gzip
)
