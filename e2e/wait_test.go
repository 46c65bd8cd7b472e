//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// How a test waits, and what a run records about it.
//
// A test waits for the event it asserts — a sysfs state, a record in
// pathmend's log, a verdict — never for a guess of seconds. eventually
// polls the condition; its limit is a safety net far above anything the
// lab has shown, not an expectation: a loaded machine makes a test slower,
// never red. A property in time ("reconnected within two ticks") is
// asserted in pathmend's own ticks (ticks_test.go), which stay ticks when a
// loaded guest runs them late.
//
// Every wait, retry and reread is recorded in $PATHMEND_LAB/out/
// e2e-records.tsv (one line each: kind, test, what, seconds taken, seconds
// allowed); hack/lab/run.sh counts them in the run's summary line and
// names the wait that came closest to its limit. A retry — a step of a
// scenario made again because an attempt lost a race the test cannot
// control — is a finding, shown as one: the test passed, but not at the
// first try. A reread — a sysfs read repeated because an object vanished
// or changed while it was read — is counted, not a finding.

// recordKind is the first field of a record line.
type recordKind string

const (
	kindWait   recordKind = "wait"
	kindRetry  recordKind = "retry"
	kindReread recordKind = "reread"
)

var recordsMu sync.Mutex

// record appends one line to the run's records; outside the lab (no
// PATHMEND_LAB) it does nothing.
func record(t *testing.T, kind recordKind, what string, took, limit time.Duration) {
	dir := os.Getenv("PATHMEND_LAB")
	if dir == "" {
		return
	}
	clean := strings.NewReplacer("\t", " ", "\n", " ").Replace(what)
	line := fmt.Sprintf("%s\t%s\t%s\t%.3f\t%.3f\n", kind, t.Name(), clean, took.Seconds(), limit.Seconds())
	recordsMu.Lock()
	defer recordsMu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "out", "e2e-records.tsv"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Logf("cannot record %s %q: %v", kind, what, err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(line); err != nil {
		t.Logf("cannot record %s %q: %v", kind, what, err)
	}
}

// retried records that a step of the test was made again, and why. The
// test goes on; the run's summary lists it as a finding.
func retried(t *testing.T, cause string) {
	t.Helper()
	t.Logf("RETRY (a finding, not a pass): %s", cause)
	record(t, kindRetry, cause, 0, 0)
}

// reread records that a read of the node's state was repeated, and why.
func reread(t *testing.T, cause string) {
	t.Helper()
	t.Logf("reread: %s", cause)
	record(t, kindReread, cause, 0, 0)
}

// eventually polls cond every 200 ms until it returns true, and fails the
// test when limit passes first. limit is a safety net: far above the time
// the event has taken in the lab, idle or loaded (hack/lab/README.md,
// "Waits"). The time it took is recorded; a wait that used more than a
// quarter of its limit says so in the test's output.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			record(t, kindWait, what, time.Since(start), limit)
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	record(t, kindWait, what, took, limit)
	if took > limit/4 {
		t.Logf("wait for %s took %s of its %s limit", what, took.Round(100*time.Millisecond), limit)
	}
}
