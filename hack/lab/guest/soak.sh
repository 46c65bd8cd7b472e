#!/bin/bash
# pathmend lab: the soak (make soak) in the guest.
#
#   bash /lab/guest/soak.sh MINUTES [SEED]
#
# Builds the soak's targets (soak_lib.sh), then runs hack/lab/soak, which
# stages the volumes through pathmend's CSI socket, runs the writers and
# the fault schedule, and writes its report to /lab/out/soak/. The exit
# status is the soak's: 0 when every must-be-0 check is 0.
set -uo pipefail
LAB=${LAB:-/lab}
export LAB_BIN=$LAB/bin
# shellcheck source=targets.sh
. "$LAB/guest/targets.sh"
# shellcheck source=soak_lib.sh
. "$LAB/guest/soak_lib.sh"
minutes=${1:-5}
seed=${2:-}
mkdir -p "$LAB/out/soak"
echo "soak: kernel $(uname -r), $minutes min of faults, seed ${seed:-random}"
if ! soak_targets_up; then
	echo "soak: building the targets failed" >&2
	exit 2
fi
args=(-lab "$LAB" -out "$LAB/out/soak" -minutes "$minutes")
[ -n "$seed" ] && args+=(-seed "$seed")
"$LAB_BIN/soak" "${args[@]}"
rc=$?
lab_teardown_all >/dev/null 2>&1
exit $rc
