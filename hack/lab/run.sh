#!/usr/bin/env bash
# pathmend lab: host-side entry point (the lab.mk targets call it).
#
#   run.sh image                  build or reuse the guest image, print its info
#   run.sh lab                    walk-through on real targets (make lab)
#   run.sh e2e [RUN_REGEXP]       run the e2e suite in the guest (make e2e)
#   run.sh fixtures [NAME...]     capture fixtures into testdata/fixtures (make fixtures)
#   run.sh shell                  interactive guest shell (make lab-shell)
#
# Each command builds the Go binaries it needs (static, CGO_ENABLED=0),
# lays out a share directory (hack/lab/out/<command>: bin/, guest/, job.sh,
# out/), boots the guest with it and reads results back from out/.
# Timeouts: LAB_BOOT_TIMEOUT (per boot), E2E_TIMEOUT (the test binary).
# LAB_FIXTURE_DIR sends captures elsewhere than testdata/fixtures.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FIXTURE_DIR=${LAB_FIXTURE_DIR:-$REPO_ROOT/testdata/fixtures}
GO=${GO:-go}

# share_dir NAME makes a fresh share with the guest library.
share_dir() {
	local d=$LAB_DIR/out/$1
	rm -rf "$d"
	mkdir -p "$d/bin" "$d/out"
	cp -r "$LAB_DIR/guest" "$d/guest"
	echo "$d"
}

# go_build OUT PKG builds a static binary.
go_build() {
	(cd "$REPO_ROOT" && CGO_ENABLED=0 timeout 900 "$GO" build -trimpath -o "$1" "$2")
}

# build_tools SHARE [pathmend] builds the guest binaries into SHARE/bin.
build_tools() {
	local share=$1 want_pathmend=${2:-}
	lab_step "Building guest binaries (capture-sysfs, csiprobe, csistage, nqnproxy, flakyproxy${want_pathmend:+, pathmend})"
	go_build "$share/bin/capture-sysfs" ./hack/capture-sysfs
	go_build "$share/bin/csiprobe" ./hack/lab/csiprobe
	go_build "$share/bin/csistage" ./hack/lab/csistage
	go_build "$share/bin/nqnproxy" ./hack/lab/nqnproxy
	go_build "$share/bin/flakyproxy" ./hack/lab/flakyproxy
	if [ -n "$want_pathmend" ]; then
		go_build "$REPO_ROOT/bin/pathmend" ./cmd/pathmend
		cp "$REPO_ROOT/bin/pathmend" "$share/bin/pathmend"
	fi
}

cmd_image() {
	local img
	img=$("$LAB_DIR/image/build.sh")
	cat "$img/info"
	echo "dir=$img"
}

cmd_shell() {
	local share img
	img=$("$LAB_DIR/image/build.sh")
	share=$(share_dir shell)
	build_tools "$share" pathmend
	LAB_BOOT_TIMEOUT=${LAB_BOOT_TIMEOUT:-14400} "$LAB_DIR/boot.sh" --shell --image "$img" "$share"
}

cmd_lab() {
	local share img rc=0
	img=$("$LAB_DIR/image/build.sh")
	share=$(share_dir lab)
	build_tools "$share" pathmend
	echo 'exec bash /lab/guest/lab.sh' >"$share/job.sh"
	"$LAB_DIR/boot.sh" --timeout "${LAB_BOOT_TIMEOUT:-600}" --image "$img" "$share" || rc=$?
	if [ $rc -ne 0 ]; then
		lab_step "Lab walk-through FAILED (exit $rc); guest log: $share/out/job.log"
		return $rc
	fi
	lab_step "Lab walk-through done; guest log: $share/out/job.log, pathmend log: $share/out/pathmend.log"
}

cmd_e2e() {
	local run=${1:-.} share img rc=0 tmo=${E2E_TIMEOUT:-1500}
	img=$("$LAB_DIR/image/build.sh")
	share=$(share_dir e2e)
	build_tools "$share" pathmend
	lab_step "Building the e2e test binary (go test -c -tags e2e ./e2e/)"
	(cd "$REPO_ROOT" && CGO_ENABLED=0 timeout 900 "$GO" test -c -tags e2e -o "$share/bin/e2e.test" ./e2e/)
	printf 'exec bash /lab/guest/e2e.sh %q %q\n' "$run" "$tmo" >"$share/job.sh"
	"$LAB_DIR/boot.sh" --timeout "${LAB_BOOT_TIMEOUT:-$((tmo + 180))}" --image "$img" "$share" || rc=$?
	report_e2e "$share/out/e2e.log" "$rc"
}

# report_e2e LOG RC prints the outcome on the host: the counts, and the
# full output of every failing test.
report_e2e() {
	local log=$1 rc=$2 pass fail skip
	if [ ! -s "$log" ]; then
		lab_step "e2e: no test output came back (guest exit $rc)"
		echo "e2e: 0 passed, 1 failed"
		return 1
	fi
	pass=$(grep -c '^\s*--- PASS' "$log" || true)
	fail=$(grep -c '^\s*--- FAIL' "$log" || true)
	skip=$(grep -c '^\s*--- SKIP' "$log" || true)
	if [ "$fail" -gt 0 ] || [ "$rc" -ne 0 ]; then
		echo
		echo "==================== failing e2e tests ===================="
		awk '
			/^=== (RUN|CONT|PAUSE)/ { cur = $3; if (!(cur in out)) order[n++] = cur; next }
			/^\s*--- FAIL: / { failed[$3] = 1 }
			{ if (cur != "") out[cur] = out[cur] $0 "\n" }
			END { for (i = 0; i < n; i++) if (order[i] in failed) printf "--- %s\n%s\n", order[i], out[order[i]] }
		' "$log"
		grep -E '^(FAIL|panic:|test timed out)' "$log" || true
		echo "==========================================================="
	fi
	echo "e2e: $pass passed, $fail failed, $skip skipped"
	if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
		lab_step "e2e: the guest run failed (exit $rc) without a failing test: see $log"
	fi
	return "$rc"
}

cmd_fixtures() {
	local share img names name rc failed=()
	img=$("$LAB_DIR/image/build.sh")
	share=$(share_dir fixtures)
	build_tools "$share"
	if [ $# -gt 0 ]; then
		names=("$@")
	else
		mapfile -t names < <(LAB=$share bash "$LAB_DIR/guest/fixtures.sh" list)
	fi
	mkdir -p "$FIXTURE_DIR"
	for name in "${names[@]}"; do
		lab_step "Fixture $name: fresh guest"
		printf 'exec bash /lab/guest/fixtures.sh %q\n' "$name" >"$share/job.sh"
		rc=0
		"$LAB_DIR/boot.sh" --timeout "${LAB_BOOT_TIMEOUT:-300}" --image "$img" "$share" || rc=$?
		if [ $rc -ne 0 ] || [ ! -s "$share/out/fixtures/$name.sysfs" ]; then
			lab_step "Fixture $name FAILED (exit $rc)"
			failed+=("$name")
			continue
		fi
		cp "$share/out/fixtures/$name.sysfs" "$FIXTURE_DIR/$name.sysfs"
		lab_step "Fixture $name -> $FIXTURE_DIR/$name.sysfs ($(wc -l <"$FIXTURE_DIR/$name.sysfs") lines)"
	done
	if [ ${#failed[@]} -gt 0 ]; then
		lab_die "fixtures failed: ${failed[*]}"
	fi
}

main() {
	local cmd=${1:-}
	[ $# -gt 0 ] && shift
	command -v "$GO" >/dev/null || lab_die "go not found (GO=$GO)"
	lab_host_packages "${LAB_HOST_PACKAGES[@]}"
	case $cmd in
	image) cmd_image "$@" ;;
	lab) cmd_lab "$@" ;;
	e2e) cmd_e2e "$@" ;;
	fixtures) cmd_fixtures "$@" ;;
	shell) cmd_shell "$@" ;;
	*) lab_die "usage: run.sh image|lab|e2e [RUN]|fixtures [NAME...]|shell" ;;
	esac
}

main "$@"
