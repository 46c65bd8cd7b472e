package driver

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"
)

// waitFor polls cond without a wall-clock assertion: the goroutines the
// test drives run on their own, so it yields until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 100000 {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

func codeOf(err error) codes.Code {
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return codes.Unknown
}

func TestKernelCalls_ACallThatReturnsInTimeAnswersItsResult(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC))
	k := newKernelCalls(clk, 10*time.Second)
	want := errors.New("umount: target is busy")
	if err := k.run(context.Background(), "vol-a", "the unmount of /s", func() error { return want }); !errors.Is(err, want) {
		t.Errorf("run = %v, want the call's error", err)
	}
	if n := k.pending(); n != 0 {
		t.Errorf("%d calls pending after the call returned", n)
	}
}

// A call still in the kernel at the bound: the RPC answers Aborted naming
// it; the volume stays busy (every later call of it answered at once,
// nothing started) until the call returns; no goroutine piles up.
func TestKernelCalls_ABlockedCallIsLeftBehindAndKeepsTheVolumeBusy(t *testing.T) {
	start := time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	k := newKernelCalls(clk, 10*time.Second)
	release := make(chan struct{})
	entered := make(chan struct{})
	answered := make(chan error, 1)
	go func() {
		answered <- k.run(context.Background(), "vol-a", "the unmount of /s", func() error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	waitFor(t, "the RPC to wait on the bound", clk.HasWaiters)
	clk.Step(10 * time.Second)
	err := <-answered
	if codeOf(err) != codes.Aborted || !strings.Contains(err.Error(), "the unmount of /s has been waiting in the kernel since 2026-12-04T17:00:00Z") {
		t.Fatalf("past the bound: %v", err)
	}

	started := false
	err = k.run(context.Background(), "vol-a", "the statfs of /s", func() error { started = true; return nil })
	if started || codeOf(err) != codes.Aborted || !strings.Contains(err.Error(), "the unmount of /s") {
		t.Errorf("a second call while the first is in the kernel: started %t, %v", started, err)
	}
	if err := k.pendingError("vol-a"); codeOf(err) != codes.Aborted {
		t.Errorf("pendingError = %v", err)
	}
	// Another volume is not held up.
	if err := k.run(context.Background(), "vol-b", "the unmount of /t", func() error { return nil }); err != nil {
		t.Errorf("another volume's call: %v", err)
	}
	if n := k.pending(); n != 1 {
		t.Errorf("%d calls pending, want the one blocked", n)
	}

	close(release)
	waitFor(t, "the blocked call to return", func() bool { return k.pending() == 0 })
	if err := k.pendingError("vol-a"); err != nil {
		t.Errorf("after the call returned: %v", err)
	}
	if err := k.run(context.Background(), "vol-a", "the unmount of /s", func() error { return nil }); err != nil {
		t.Errorf("the retry after the call returned: %v", err)
	}
}

func TestKernelCalls_TheRPCsEndStopsTheWait(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC))
	k := newKernelCalls(clk, time.Hour)
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := k.run(ctx, "vol-a", "the unmount of /s", func() error { <-release; return nil })
	if codeOf(err) != codes.Aborted {
		t.Errorf("with the RPC's context ended: %v", err)
	}
	close(release)
	waitFor(t, "the call to return", func() bool { return k.pending() == 0 })
}

// A panic in the call is the RPC's: raised again where the RPC waits.
func TestKernelCalls_APanicReachesTheWaitingRPC(t *testing.T) {
	k := newKernelCalls(clocktesting.NewFakeClock(time.Now()), time.Hour)
	defer func() {
		if x := recover(); x != "boom" {
			t.Errorf("recovered %v, want the call's panic", x)
		}
		if n := k.pending(); n != 0 {
			t.Errorf("%d calls pending after the panic", n)
		}
	}()
	_ = k.run(context.Background(), "vol-a", "the unmount of /s", func() error { panic("boom") })
	t.Error("run returned after a panic")
}
