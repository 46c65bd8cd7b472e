#!/usr/bin/env bash
# pathmend lab: host-side entry point (the lab.mk targets call it).
#
#   run.sh image                  build or reuse the guest image, print its info
#   run.sh lab                    walk-through on real targets (make lab)
#   run.sh e2e [RUN_REGEXP]       run the e2e suite in the guest (make e2e)
#   run.sh fixtures [NAME...]     capture fixtures into testdata/fixtures (make fixtures)
#   run.sh soak MINUTES [SEED]    the fault soak with verified I/O (make soak)
#   run.sh shell                  interactive guest shell (make lab-shell)
#
# Each command builds the Go binaries it needs (static, CGO_ENABLED=0),
# lays out a share directory (hack/lab/out/<command>: bin/, guest/, job.sh,
# out/), boots the guest with it and reads results back from out/.
# Timeouts: LAB_BOOT_TIMEOUT (per boot), E2E_TIMEOUT (the test binary).
# LAB_OUT (default hack/lab/out) holds the share directories: two
# commands at once from one checkout need one each.
# LAB_FIXTURE_DIR sends captures elsewhere than testdata/fixtures.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FIXTURE_DIR=${LAB_FIXTURE_DIR:-$REPO_ROOT/testdata/fixtures}
GO=${GO:-$REPO_ROOT/hack/go}
# TIMINGS gets one line per lab or e2e run (hack/lab/timings/README.md):
# copied into hack/lab/timings/runs.tsv, it regenerates the measured table
# of hack/lab/README.md (make lab-timings).
TIMINGS=$LAB_OUT/timings.tsv
T_BUILD=0
T_GUEST=0
GOCACHE_STATE=

# now prints seconds since the epoch with a fraction.
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

# gocache_state says whether the Go build cache is cold (nearly empty:
# every package compiles) or warm, before the first build of this run.
gocache_state() {
	local d
	d=$("$GO" env GOCACHE 2>/dev/null) || d=
	if [ -z "$d" ] || [ "$(find "$d" -maxdepth 2 -type f 2>/dev/null | head -n 200 | wc -l)" -lt 200 ]; then
		echo cold
	else
		echo warm
	fi
}

# image_build runs build.sh, sets IMG to the image directory and records
# whether it reused the image (not in a subshell: it sets globals).
image_build() {
	local built
	IMG=$("$LAB_DIR/image/build.sh") || return
	# The image's info says when it was built: during this run means
	# built now (build_seconds is how long it took), before means cached.
	built=$(date -d "$(awk -F= '/^built=/ { print $2 }' "$IMG/info")" +%s 2>/dev/null) || built=0
	if [ "$built" -ge "${LAB_T0%.*}" ]; then
		IMAGE_ACTION="built $(awk -F= '/^build_seconds=/ { print $2 }' "$IMG/info")s"
	else
		IMAGE_ACTION=cached
	fi
	IMAGE_KERNEL=$(awk -F= '/^kernel_release=/ { print $2 }' "$IMG/info")
}

# load_start samples the host's 1-minute load average every 10 s until
# record; load_mean prints the mean of the samples so far. The machine is
# shared: a run's time means little without the load it ran under.
LOAD_SAMPLES=
load_start() {
	LOAD_SAMPLES=$(mktemp)
	(while :; do cut -d' ' -f1 /proc/loadavg; sleep 10; done) >"$LOAD_SAMPLES" 2>/dev/null &
	LOAD_PID=$!
	trap 'kill "$LOAD_PID" 2>/dev/null; rm -f "$LOAD_SAMPLES"' EXIT
}
load_mean() {
	awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n; else printf "-" }' "$LOAD_SAMPLES" 2>/dev/null || echo -
}

# record CMD RUN RESULT [TESTS SLOWEST [RETRIES [WAIT_RATIO]]] appends
# this run to $TIMINGS: date, command, -test.run, image (cached | built
# N s), Go cache, seconds to build the binaries, seconds in the guest,
# total seconds, result, tests passed/failed/skipped, slowest
# test=seconds, kernel, cores, memory; then the host's mean load average
# during the run (with ", N burners" when hack/lab/underload.sh ran CPU
# burners beside it), the retries the run needed (a finding each) and the
# smallest ratio of a wait's limit to the time it took.
record() {
	local total load
	total=$(secs "$LAB_T0" "$(now)")
	load=$(load_mean)
	[ "${LAB_BURNERS:-0}" -gt 0 ] && load="$load, $LAB_BURNERS burners"
	mkdir -p "$(dirname "$TIMINGS")"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
		"$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2" "${IMAGE_ACTION:-unknown}" "$GOCACHE_STATE" \
		"$T_BUILD" "$T_GUEST" "$total" "$3" "${4:--}" "${5:--}" "${IMAGE_KERNEL:-}" "$(nproc)" \
		"$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)GiB" \
		"$load" "${6:--}" "${7:--}" >>"$TIMINGS"
	lab_step "Timing recorded in $TIMINGS: total ${total}s (image ${IMAGE_ACTION:-?}, Go cache $GOCACHE_STATE, builds ${T_BUILD}s, guest ${T_GUEST}s, host load $load)"
}

# boot runs boot.sh and adds its wall time to T_GUEST.
boot() {
	local t0 rc=0
	t0=$(now)
	"$LAB_DIR/boot.sh" "$@" || rc=$?
	T_GUEST=$((T_GUEST + $(secs "$t0" "$(now)")))
	return $rc
}

# share_dir NAME makes a fresh share with the guest library.
share_dir() {
	local d=$LAB_OUT/$1
	rm -rf "$d"
	mkdir -p "$d/bin" "$d/out"
	cp -r "$LAB_DIR/guest" "$d/guest"
	echo "$d"
}

# go_build OUT PKG builds a static binary.
go_build() {
	local t0 rc=0
	t0=$(now)
	(cd "$REPO_ROOT" && CGO_ENABLED=0 timeout 900 "$GO" build -trimpath -o "$1" "$2") || rc=$?
	T_BUILD=$((T_BUILD + $(secs "$t0" "$(now)")))
	return $rc
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
	image_build
	img=$IMG
	share=$(share_dir lab)
	build_tools "$share" pathmend
	echo 'exec bash /lab/guest/lab.sh' >"$share/job.sh"
	boot --timeout "${LAB_BOOT_TIMEOUT:-600}" --image "$img" "$share" || rc=$?
	if [ $rc -ne 0 ]; then
		record lab - fail
		lab_step "Lab walk-through FAILED (exit $rc); guest log: $share/out/job.log"
		return $rc
	fi
	record lab - pass
	lab_step "Lab walk-through done; guest log: $share/out/job.log, pathmend log: $share/out/pathmend.log"
}

cmd_e2e() {
	local run=${1:-.} share img rc=0 tmo=${E2E_TIMEOUT:-5400} t0 log
	image_build
	img=$IMG
	share=$(share_dir e2e)
	build_tools "$share" pathmend
	lab_step "Building the e2e test binary (go test -c -tags e2e ./e2e/)"
	t0=$(now)
	(cd "$REPO_ROOT" && CGO_ENABLED=0 timeout 900 "$GO" test -c -tags e2e -o "$share/bin/e2e.test" ./e2e/)
	T_BUILD=$((T_BUILD + $(secs "$t0" "$(now)")))
	printf 'exec bash /lab/guest/e2e.sh %q %q\n' "$run" "$tmo" >"$share/job.sh"
	boot --timeout "${LAB_BOOT_TIMEOUT:-$((tmo + 180))}" --image "$img" "$share" || rc=$?
	log=$share/out/e2e.log
	report_e2e "$log" "$rc" "$share/out/e2e-records.tsv" || rc=$?
	record e2e "$run" "$([ "$rc" -eq 0 ] && echo pass || echo fail)" \
		"$(grep -c '^--- PASS' "$log" 2>/dev/null || true)/$(grep -c '^--- FAIL' "$log" 2>/dev/null || true)/$(grep -c '^--- SKIP' "$log" 2>/dev/null || true)" \
		"$(slowest_tests "$log")" "$(record_count retry "$share/out/e2e-records.tsv")" "$(wait_ratio "$share/out/e2e-records.tsv")"
	return "$rc"
}

cmd_soak() {
	local minutes=${1:-5} seed=${2:-} share img rc=0 out
	image_build
	img=$IMG
	share=$(share_dir soak)
	build_tools "$share" pathmend
	go_build "$share/bin/soak" ./hack/lab/soak
	printf 'exec bash /lab/guest/soak.sh %q %q\n' "$minutes" "$seed" >"$share/job.sh"
	# Faults start during MINUTES; setup, the last holds, settling and the
	# checks take up to about 30 min more.
	boot --timeout "${LAB_BOOT_TIMEOUT:-$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 1800 }')}" --mem "${LAB_MEM:-3072}" --image "$img" "$share" || rc=$?
	out=$share/out/soak
	if [ -s "$out/report.json" ]; then
		lab_step "soak report: $out/report.txt (JSON: report.json, every event: timeline.txt, pathmend's log: pathmend.log)"
	else
		lab_step "soak: no report came back (guest exit $rc); guest log: $share/out/job.log"
		[ "$rc" -eq 0 ] && rc=1
	fi
	record soak "SOAK_MINUTES=$minutes" "$([ "$rc" -eq 0 ] && echo pass || echo fail)" \
		"$(soak_faults "$out/report.json")" "$(soak_latencies "$out/report.json")" \
		"$(awk -F'[:,]' '/"retryCount":/ { gsub(/ /, "", $2); print $2; exit }' "$out/report.json" 2>/dev/null || echo -)"
	return "$rc"
}

# soak_faults REPORT prints the faults done/skipped/failed of a soak report.
soak_faults() {
	[ -s "$1" ] || { echo -; return; }
	awk '/"result": "done"/ { d++ } /"result": "skipped"/ { s++ } /"result": "failed"/ { f++ } END { printf "%d/%d/%d", d, s, f }' "$1"
}

# soak_latencies REPORT prints each fault kind's longest heal latency
# ("nvme-port-unlink=12.3,…"), as slowest_tests does for tests; a kind
# none of whose faults healed has no latency (the report counts them).
soak_latencies() {
	[ -s "$1" ] || return 0
	awk '
		/"healLatency": \{/ { in_l = 1; next }
		in_l && /^  \}/ { in_l = 0 }
		in_l && /^    "[^"]+": \{/ { k = $1; gsub(/[":]/, "", k); healed = 0 }
		in_l && /"n":/ { healed = ($2 + 0 > 0) }
		in_l && healed && /"maxSeconds":/ { v = $2; gsub(/,/, "", v); printf "%s%s=%.1f", (n++ ? "," : ""), k, v }
	' "$1"
}

# slowest_tests LOG prints every top-level test of LOG with its seconds,
# slowest first: "TestA=231.4,TestB=12.0".
slowest_tests() {
	sed -nE 's/^--- (PASS|FAIL): ([^ ]+) \(([0-9.]+)s\)$/\3 \2/p' "$1" 2>/dev/null |
		sort -rn | awk '{ printf "%s%s=%s", (NR > 1 ? "," : ""), $2, $1 }'
}

# record_count KIND RECORDS counts the records of one kind (wait, retry,
# reread) the e2e tests wrote (e2e/wait_test.go).
record_count() {
	if [ -s "$2" ]; then awk -F'\t' -v k="$1" '$1 == k { n++ } END { print n + 0 }' "$2"; else echo 0; fi
}

# wait_ratio RECORDS prints the smallest ratio of a wait's limit to the
# time it took ("-" without waits): how close the run came to a limit.
wait_ratio() {
	[ -s "$1" ] || { echo -; return; }
	awk -F'\t' '$1 == "wait" { r = ($4 > 0.05 ? $5 / $4 : $5 / 0.05); if (min == "" || r < min) min = r } END { if (min == "") print "-"; else printf "%.1f", min }' "$1"
}

# report_records RECORDS LOG prints the flake accounting: every retry
# with its cause (a finding: the test needed a second try), the rereads
# by cause, and the three waits that came closest to their limits.
report_records() {
	local recs=$1 log=$2
	[ -s "$recs" ] || return 0
	if [ "$(record_count retry "$recs")" -gt 0 ]; then
		echo
		echo "==================== retries (findings, not passes) ===================="
		awk -F'\t' '$1 == "retry" { printf "  %s: %s\n", $2, $3 }' "$recs"
	fi
	if [ "$(record_count reread "$recs")" -gt 0 ]; then
		echo "---- rereads (sysfs changed while read), by test"
		awk -F'\t' '$1 == "reread" { split($2, a, "/"); n[a[1]]++; c[a[1]] = $3 } END { for (k in n) printf "  %s: %d (last: %s)\n", k, n[k], c[k] }' "$recs" | sort
	fi
	echo "---- the waits closest to their limits (time taken of the limit)"
	awk -F'\t' '$1 == "wait" { printf "%.4f\t%s\t%s\t%.1f\t%.0f\n", $4 / $5, $2, $3, $4, $5 }' "$recs" | sort -rn | head -n 3 |
		awk -F'\t' '{ printf "  %.1f s of %s s (1/%.1f): %s: %s\n", $4, $5, ($4 > 0.05 ? $5 / $4 : $5 / 0.05), $2, $3 }'
}

# report_e2e LOG RC [RECORDS] prints the outcome on the host: the
# full output of every failing test, the retries and closest waits, and
# the summary line: passed at the first try, passed after a retry (each
# a finding), failed, skipped; retries, rereads, waits and the closest
# any wait came to its limit.
report_e2e() {
	local log=$1 rc=$2 recs=${3:-} pass fail skip retried=0 retries=0 rereads=0 waits=0 ratio=-
	if [ ! -s "$log" ]; then
		lab_step "e2e: no test output came back (guest exit $rc)"
		echo "e2e: 0 passed, 1 failed"
		return 1
	fi
	pass=$(grep -c '^\s*--- PASS' "$log" || true)
	fail=$(grep -c '^\s*--- FAIL' "$log" || true)
	skip=$(grep -c '^\s*--- SKIP' "$log" || true)
	if [ -n "$recs" ] && [ -s "$recs" ]; then
		retries=$(record_count retry "$recs")
		rereads=$(record_count reread "$recs")
		waits=$(record_count wait "$recs")
		ratio=$(wait_ratio "$recs")
		# Passed tests (top level or not) that recorded a retry.
		retried=$(awk -F'\t' 'FNR == NR { if ($1 == "retry") r[$2] = 1; next }
			/^\s*--- PASS: / { split($0, f, " "); if (f[3] in r) n++ } END { print n + 0 }' "$recs" "$log")
		pass=$((pass - retried))
	fi
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
	[ -n "$recs" ] && report_records "$recs" "$log"
	echo "e2e: $pass passed, $retried passed after a retry (findings), $fail failed, $skip skipped; $retries retries, $rereads rereads; $waits waits, the closest at 1/$ratio of its limit"
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
	load_start
	lab_host_packages "${LAB_HOST_PACKAGES[@]}"
	GOCACHE_STATE=$(gocache_state)
	case $cmd in
	image) cmd_image "$@" ;;
	lab) cmd_lab "$@" ;;
	e2e) cmd_e2e "$@" ;;
	fixtures) cmd_fixtures "$@" ;;
	shell) cmd_shell "$@" ;;
	soak) cmd_soak "$@" ;;
	*) lab_die "usage: run.sh image|lab|e2e [RUN]|fixtures [NAME...]|shell|soak MINUTES [SEED]" ;;
	esac
}

main "$@"
