#!/bin/bash
# pathmend lab: run the e2e test binary in the guest.
#
#   bash /lab/guest/e2e.sh [RUN_REGEXP] [TIMEOUT_SECONDS]
#
# Output goes to the console and /lab/out/e2e.log; the exit status is the
# test binary's.
set -uo pipefail
LAB=${LAB:-/lab}
run=${1:-.}
tmo=${2:-1500}
export PATHMEND_LAB=$LAB
cd /tmp || exit 1
echo "e2e: kernel $(uname -r), running -test.run '$run' (timeout ${tmo}s)"
timeout -k 10 $((tmo + 30)) "$LAB/bin/e2e.test" -test.v -test.count=1 -test.timeout "${tmo}s" -test.run "$run" \
	> >(tee "$LAB/out/e2e.log") 2>&1
rc=$?
sleep 0.5
exit $rc
