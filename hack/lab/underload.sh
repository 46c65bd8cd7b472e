#!/usr/bin/env bash
# underload.sh CMD...: run CMD with CPU burners on the host for the whole
# run — LAB_BURNERS of them (default 2, one per core of the lab's
# machines), each a busy loop at normal priority — and stop them when CMD
# ends. make e2e-under-load runs the e2e suite, the soak and the kubelet
# lab this way: a real-kernel test that turns red only because the machine
# is busy is a test bug, and this is how one shows.
#
# LAB_BURNERS is exported: hack/lab/run.sh records the burners beside the
# host's load average of every run (hack/lab/timings).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ $# -gt 0 ] || lab_die "usage: underload.sh CMD..."
export LAB_BURNERS=${LAB_BURNERS:-2}
pids=()
stop_burners() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap stop_burners EXIT INT TERM
for ((i = 0; i < LAB_BURNERS; i++)); do
	bash -c 'while :; do :; done' &
	pids+=("$!")
done
lab_step "$LAB_BURNERS CPU burners at normal priority (pids ${pids[*]}) until the command ends: $*"
rc=0
# Each step of the command times itself from its own start (lib.sh:
# LAB_T0): without this, its record would count the steps before it.
env -u LAB_T0 "$@" || rc=$?
stop_burners
lab_step "burners stopped; exit status $rc"
exit "$rc"
