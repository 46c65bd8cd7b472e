#!/usr/bin/env bash
# Boot the lab guest once with a host directory shared as /lab.
#
#   boot.sh [--shell] [--timeout SECS] [--mem MB] [--image DIR] SHARE
#
# Job mode (default): the guest runs SHARE/job.sh, its output appears here
# as it runs (and in SHARE/out/job.log), and boot.sh exits with the job's
# exit status read back from SHARE/out/rc. No rc file means the guest died
# or hit the timeout: boot.sh then exits 124 (timeout) or 125.
# Shell mode (--shell): an interactive shell on the serial console; the
# guest powers off when the shell exits.
#
# qemu always runs under timeout(1) (TCG: KVM does not work on these
# machines), so a wedged guest can never hang the caller.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mode=job
tmo=${LAB_BOOT_TIMEOUT:-600}
mem=${LAB_MEM:-2048}
image=
while [ $# -gt 0 ]; do
	case $1 in
	--shell) mode=shell ;;
	--timeout) tmo=$2; shift ;;
	--mem) mem=$2; shift ;;
	--image) image=$2; shift ;;
	-*) lab_die "boot.sh: unknown option $1" ;;
	*) break ;;
	esac
	shift
done
[ $# -eq 1 ] || lab_die "usage: boot.sh [--shell] [--timeout SECS] [--mem MB] [--image DIR] SHARE"
share=$(cd "$1" && pwd)
[ -n "$image" ] || image=$("$LAB_DIR/image/build.sh")
[ -s "$image/vmlinuz" ] || lab_die "no guest image in $image"
rm -rf "$share/out"
mkdir -p "$share/out"

# no_timer_check: the kernel's boot-time check that timer interrupts
# arrive through the IO-APIC fails when a busy host leaves the TCG guest no
# CPU for a moment ("Kernel panic - not syncing: IO-APIC + timer doesn't
# work!", seen with the host's load average at 8); the check is for broken
# hardware, and the kernel skips it on hypervisors it recognises.
append="console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check rdinit=/init lab.mode=$mode"
args=(
	-accel tcg -cpu max -m "$mem" -smp "${LAB_SMP:-2}" -no-reboot -nic none
	-kernel "$image/vmlinuz" -initrd "$image/initramfs.cpio" -append "$append"
	-virtfs "local,path=$share,mount_tag=host0,security_model=none,id=host0"
)
lab_step "Booting guest (${mode} mode, timeout ${tmo}s)"
set +e
if [ "$mode" = shell ]; then
	timeout --foreground -k 10 "$tmo" qemu-system-x86_64 "${args[@]}" -nographic
	rc=$?
	[ $rc = 124 ] && lab_die "guest shell hit the ${tmo}s timeout (LAB_BOOT_TIMEOUT)"
	exit 0
fi
timeout -k 10 "$tmo" qemu-system-x86_64 "${args[@]}" -display none -monitor none -serial stdio </dev/null
qrc=$?
set -e
if [ -s "$share/out/rc" ]; then
	rc=$(cat "$share/out/rc")
	lab_step "Guest powered off (job exit status $rc)"
	exit "$rc"
fi
if [ $qrc = 124 ] || [ $qrc = 137 ]; then
	lab_step "Guest killed after the ${tmo}s timeout"
	exit 124
fi
lab_step "Guest stopped without a job result (qemu exit $qrc)"
exit 125
