package flakyproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBreaker plays one outcome per attempt: "won" (every reopen after the
// portal passes is closed unbound), "lost" (iscsid logs in again) or
// "bound" (a reopen is seen bound).
type fakeBreaker struct {
	mu       sync.Mutex
	outcomes []string
	breaking bool
	passed   string // the outcome being played since the last Pass
	resets   int
	bound    int
	fwdU     int
	fwdB     int
	loggedIn bool
	breaks   int
}

func (f *fakeBreaker) Break(func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.breaking, f.loggedIn, f.passed = true, false, ""
	f.breaks++
}

func (f *fakeBreaker) Pass() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.breaking = false
	if len(f.outcomes) > 0 {
		f.passed, f.outcomes = f.outcomes[0], f.outcomes[1:]
	}
}

func (f *fakeBreaker) Resets() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.breaking {
		f.resets++
		f.bound++
	}
	return f.resets, f.bound
}

func (f *fakeBreaker) UnboundRun() int { return 3 }

func (f *fakeBreaker) Forwards() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.passed {
	case "won":
		f.fwdU++
	case "bound":
		f.fwdB++
	case "lost":
		f.loggedIn = true
	}
	return f.fwdB, f.fwdU
}

func (f *fakeBreaker) session() (bool, bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loggedIn {
		return true, true, "LOGGED_IN"
	}
	return true, false, "FAILED"
}

func fastOptions(logs *[]string) StuckOptions {
	return StuckOptions{Budget: 5 * time.Second, BreakFor: 50 * time.Millisecond, LeaveWait: time.Second,
		SelfRecovery: 200 * time.Millisecond, Poll: time.Millisecond,
		Logf: func(f string, a ...any) { *logs = append(*logs, fmt.Sprintf(f, a...)) }}
}

func TestStuck_RetriesLostAttemptsUntilOneWins(t *testing.T) {
	f := &fakeBreaker{outcomes: []string{"lost", "bound", "won"}, loggedIn: true}
	var logs, lost []string
	o := fastOptions(&logs)
	o.Lost = func(cause string) { lost = append(lost, cause) }
	if err := stuck(context.Background(), f, f.session, nil, o); err != nil {
		t.Fatal(err)
	}
	if f.breaks != 3 {
		t.Errorf("%d attempts, want 3", f.breaks)
	}
	if len(lost) != 2 || !strings.Contains(lost[0], "attempt 1 ") || !strings.Contains(lost[0], "LOGGED_IN again") || !strings.Contains(lost[1], "a reopen was bound") {
		t.Errorf("Lost was told %q, want attempt 1 LOGGED_IN again and attempt 2 a reopen bound", lost)
	}
	got := strings.Join(logs, "\n")
	for _, want := range []string{"LOGGED_IN again", "a reopen was bound", "closed without a bind", "reached on attempt"} {
		if !strings.Contains(got, want) {
			t.Errorf("logs lack %q:\n%s", want, got)
		}
	}
}

// A session still down after SelfRecovery with too few reopens to tell
// is stuck too.
func TestStuck_DownPastSelfRecoveryIsStuck(t *testing.T) {
	f := &fakeBreaker{outcomes: []string{"quiet"}, loggedIn: true}
	var logs []string
	if err := stuck(context.Background(), f, f.session, nil, fastOptions(&logs)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(logs, "\n"), "with its portal passing") {
		t.Errorf("logs %v", logs)
	}
}

func TestStuck_GivesUpAfterTheBudgetAndOnCancel(t *testing.T) {
	lost := make([]string, 1000)
	for i := range lost {
		lost[i] = "lost"
	}
	f := &fakeBreaker{outcomes: lost}
	var logs []string
	o := fastOptions(&logs)
	o.Budget = 100 * time.Millisecond
	if err := stuck(context.Background(), f, f.session, nil, o); err == nil || !strings.Contains(err.Error(), "no stuck session") {
		t.Errorf("budget: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f = &fakeBreaker{outcomes: []string{"won"}}
	if err := stuck(ctx, f, f.session, nil, fastOptions(&logs)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	if f.breaking {
		t.Error("left breaking after the context ended")
	}
}
