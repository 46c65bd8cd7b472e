package monitor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
)

// Two volumes are namespaces 1 and 2 of one two-port subsystem. Namespace
// 2 is disabled on the target, then enabled again while the target's
// change events do not reach the host (the fake kernel holds them, as the
// lab's proxy does), so only a rescan can bring it back. Tearing the
// subsystem down would strand namespace 1: that stays refused throughout.
// The rescan is not: it runs in the first tick that sees the namespace
// missing, then once per cooldown, and the first one after the enable
// brings the namespace back — as a new head — with nothing torn down.
func TestTick_RescanRunsForAMissingNamespaceWhoseTeardownIsRefused(t *testing.T) {
	shared := nvmetest.Target{NQN: nqnA, Ports: map[string]string{"127.0.0.1:4420": "optimized", "127.0.0.2:4420": "non-optimized"},
		Namespaces: []nvmetest.Namespace{
			{Head: 1, NSID: 1, UUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427"},
			{Head: 2, NSID: 2, UUID: "2b4e28ba-2fa1-11d2-883f-0016d3cca427"},
		}}
	r := newRig(t, heal.ModeRepair, nil)
	r.k.AddTarget(shared)
	vol1, vol2 := rec("vol-1", nqnA, "127.0.0.1", "127.0.0.2"), rec("vol-2", nqnA, "127.0.0.1", "127.0.0.2")
	vol2.Context.NVMe.NSID = 2
	r.set(t, vol1, vol2)
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	head2, _, _ := r.k.Head(nqnA, 2)

	r.k.SetNamespaceEnabled(nqnA, 2, false)
	before := len(r.k.Calls())
	rep := r.tickStepping(t)
	o := outcomeOf(t, rep, heal.NamespaceMissing)
	if o.Verdict != heal.Refused || !strings.HasPrefix(o.Reason, "would leave co-tenants") || o.FirstStep != "rescan nvme1, nvme0: the defect remains" {
		t.Fatalf("namespace disabled: %+v", o)
	}
	if diff := cmp.Diff([]string{"rescan nvme1", "rescan nvme0"}, r.callsSince(before)); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}

	// Enabled with the events held back: invisible to the host, and the
	// rescan waits for its cooldown (60 s).
	r.k.HoldEvents(nqnA, true)
	r.k.SetNamespaceEnabled(nqnA, 2, true)
	for range 50 {
		r.clk.Step(time.Second)
		r.k.Refresh()
		rep = r.m.Tick(context.Background())
		if o := outcomeOf(t, rep, heal.NamespaceMissing); o.Verdict != heal.Refused || o.FirstStep != "" {
			t.Fatalf("inside the rescan's cooldown: %+v", o)
		}
	}
	if _, _, ok := r.k.Head(nqnA, 2); ok {
		t.Fatal("the host saw namespace 2 without a rescan")
	}
	if diff := cmp.Diff([]string{"rescan nvme1", "rescan nvme0"}, r.callsSince(before)); diff != "" {
		t.Fatalf("calls inside the cooldown (-want +got):\n%s", diff)
	}

	var cured heal.Outcome
	for range 15 {
		r.clk.Step(time.Second)
		r.k.Refresh()
		rep = r.tickStepping(t)
		if len(rep.Outcomes) > 0 && rep.Outcomes[0].Verdict == heal.Repaired {
			cured = rep.Outcomes[0]
			break
		}
	}
	if cured.Reason != "rescan nvme1, nvme0: the defect is gone; nothing torn down" || len(cured.Removed) != 0 {
		t.Fatalf("after the cooldown: %+v", cured)
	}
	for _, c := range r.callsSince(before) {
		if strings.HasPrefix(c, "delete") {
			t.Fatalf("a controller was torn down: %v", r.callsSince(before))
		}
	}
	head, _, ok := r.k.Head(nqnA, 2)
	if !ok || head == head2 {
		t.Errorf("namespace 2 after the rescan: head %d (ok %t), want a new head (was %d)", head, ok, head2)
	}
	if st, _ := r.status("vol-2"); func() int { l, _ := st.Live(); return l }() != 2 {
		t.Errorf("vol-2 after the rescan: %+v", st)
	}
}

func outcomeOf(t *testing.T, rep Report, k heal.Kind) heal.Outcome {
	t.Helper()
	for _, o := range rep.Outcomes {
		if o.Defect.Kind == k {
			return o
		}
	}
	t.Fatalf("no %s outcome in %+v (defects %+v)", k, rep.Outcomes, rep.Defects)
	return heal.Outcome{}
}

// tickStepping runs a tick while stepping the fake clock whenever the
// tick waits on it (the rescan watches sysfs on the injected clock), in
// 100 ms steps.
func (r *rig) tickStepping(t *testing.T) Report {
	t.Helper()
	done := make(chan Report, 1)
	go func() { done <- r.m.Tick(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case rep := <-done:
			return rep
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("tick still running after 10 s")
		}
		if r.clk.HasWaiters() {
			r.clk.Step(100 * time.Millisecond)
			r.k.Refresh()
		}
		time.Sleep(time.Millisecond)
	}
}
