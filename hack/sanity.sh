#!/usr/bin/env bash
# make sanity: runs TestSanity (csi-sanity against the real NodeServer on
# loop devices) with -v into .sanity.log and prints a plain summary: the
# "Ran N of M Specs" line, the counts, why each skipped or pending spec
# did not run, and the verdict. It fails when the test fails, and also when
# TestSanity skipped or ran no spec: `make sanity` that did not run
# csi-sanity has not passed.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-hack/go}
log=.sanity.log

PATHMEND_SANITY=1 "$GO" test -race -count=1 -timeout "${GO_TEST_TIMEOUT:-45m}" -run '^TestSanity$' -v ./pkg/driver/ >"$log" 2>&1
rc=$?

# ginkgo runs with NoColor; strip any escape that slipped in anyway.
sed -E 's/\x1b\[[0-9;]*m//g' "$log" |
	grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!|--- (PASS|FAIL|SKIP): TestSanity|ok |FAIL)|sanity_test\.go:[0-9]+: ' |
	sed -E 's/^.*sanity_test\.go:[0-9]+: /  /'

if grep -q -- '--- SKIP: TestSanity' "$log"; then
	echo "make sanity: FAILED: TestSanity skipped (reason above); csi-sanity did not run"
	exit 1
fi
if ! grep -qE '^Ran [1-9][0-9]* of [0-9]+ Specs' "$log"; then
	echo "make sanity: FAILED: no csi-sanity spec ran (exit $rc); see $log"
	exit 1
fi
if [ "$rc" -ne 0 ]; then
	echo "make sanity: FAILED (exit $rc); the full output is in $log"
	exit "$rc"
fi
echo "make sanity: passed; the full output is in $log"
