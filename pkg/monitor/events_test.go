package monitor

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// events takes what the fake kernel announced since the last call, as a
// batch received now.
func (r *rig) events() uevent.Batch {
	evs := r.k.TakeUevents()
	for i := range evs {
		evs[i].Received = r.clk.Now()
	}
	return uevent.Batch{Events: evs}
}

// healthyTwoTargets stages vol-a on nqnA and vol-b on nqnB, two paths
// each, both connected an hour ago, and ticks once: the model has both.
func healthyTwoTargets(t *testing.T, r *rig) {
	t.Helper()
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"), rec("vol-b", nqnB, "127.0.0.3", "127.0.0.4"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.connectAged(t, nqnB, "127.0.0.3", "127.0.0.4")
	r.m.Tick(context.Background())
	r.k.Announce()
}

func decisionWords(rep EventReport) []string {
	var out []string
	for _, d := range rep.Decisions {
		out = append(out, d.Target.Name+": "+d.Words)
	}
	return out
}

// A controller an outside actor deleted: the kernel's "remove nvme" names
// it, the model says whose it is, the loop reads that subsystem alone,
// plans it and starts its job at once — which connects the endpoint
// again — with no tick; the other subsystem is not read. The job's own
// events (the new controller added, connected) then find the subsystem
// healthy: no second job.
func TestEvents_ADeletedControllerIsReconnectedOnItsRemoveEvent(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	if err := r.k.Disconnect("nvme1"); err != nil { // an outside actor's delete_controller
		t.Fatal(err)
	}
	before := len(r.k.Calls())
	b := r.events()
	if len(b.Events) != 1 || b.Events[0].String() != "remove nvme nvme1 (seq 1)" {
		t.Fatalf("announced: %v", b.Events)
	}
	ticked := r.clk.Now()
	r.clk.Step(time.Second)
	rep := r.m.HandleEvents(ctx, b)
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
	if len(rep.Decisions) != 2 || !rep.Decisions[0].Started || !strings.HasPrefix(rep.Decisions[0].Words, "job started: missing paths: 127.0.0.2:4420") {
		t.Fatalf("decisions: %q", decisionWords(rep))
	}
	// The synchronous runner ran the job inside Go: the loop settled it
	// and read the subsystem again.
	if d := rep.Decisions[1]; d.Started || d.Events[0] != "job ended" || !strings.HasPrefix(d.Words, "no job: every path") {
		t.Errorf("after the job: %+v", d)
	}
	if len(rep.Jobs) != 1 || len(rep.Jobs[0].Connects) != 1 {
		t.Errorf("jobs: %+v", rep.Jobs)
	}
	if v, _ := r.status("vol-b"); !v.ReadAt.Equal(ticked) {
		t.Errorf("vol-b was read again for an event of nqnA: %+v", v)
	}
	if v, _ := r.status("vol-a"); !v.ReadAt.Equal(r.clk.Now()) {
		t.Errorf("vol-a not written by the event's read: %+v", v)
	} else if live, _ := v.Live(); live != 2 {
		t.Errorf("vol-a after the job: %d live paths, want 2", live)
	}
	// The connect's own events: healthy, nothing to do.
	rep = r.m.HandleEvents(ctx, r.events())
	if got := decisionWords(rep); len(got) != 1 || !strings.Contains(got[0], "no job: every path of its staged volumes live") {
		t.Errorf("the reconnect's events: %q", got)
	}
	if len(r.callsSince(before)) != 1 {
		t.Errorf("calls after the reconnect's events: %q", r.callsSince(before))
	}
}

// A burst of events for one target makes one decision and one job.
func TestEvents_ABurstForOneTargetIsOneJob(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	_ = r.k.Disconnect("nvme0")
	_ = r.k.Disconnect("nvme1")
	r.k.SetState(3, "connecting")
	r.k.SetState(3, "live") // a reset: "change" of the head, then connected
	before := len(r.k.Calls())
	b := r.events()
	rep := r.m.HandleEvents(ctx, b)
	var started []string
	for _, d := range rep.Decisions {
		if d.Started {
			started = append(started, d.Target.Name)
		}
	}
	if diff := cmp.Diff([]string{nqnA}, started); diff != "" {
		t.Errorf("jobs started (-want +got):\n%s\ndecisions: %q", diff, decisionWords(rep))
	}
	if got := rep.Decisions[0].Events; len(got) != 3 {
		t.Errorf("nqnA's decision names %d events, want its two controllers' and its head's removals: %q", len(got), got)
	}
	calls := r.callsSince(before)
	if diff := cmp.Diff([]string{"connect 127.0.0.1:4420", "connect 127.0.0.2:4420"}, calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// Events that come while the target's job runs are decided on once the
// job ends: one more decision, not one per event, and not while the job
// holds the lease.
func TestEvents_EventsDuringAJobAreDecidedWhenItEnds(t *testing.T) {
	var queued []func()
	r := newRigRun(t, heal.ModeRepair, nil, func(f func()) { queued = append(queued, f) })
	healthyTwoTargets(t, r)
	for _, f := range queued { // the first tick's jobs (none expected)
		f()
	}
	queued = nil
	ctx := context.Background()
	_ = r.k.Disconnect("nvme1")
	rep := r.m.HandleEvents(ctx, r.events())
	if len(rep.Decisions) != 1 || !rep.Decisions[0].Started || len(queued) != 1 {
		t.Fatalf("decisions %q, %d jobs queued", decisionWords(rep), len(queued))
	}
	_ = r.k.Disconnect("nvme0")
	b := r.events()
	r.clk.Step(10 * time.Millisecond)
	rep = r.m.HandleEvents(ctx, b)
	if got := decisionWords(rep); len(got) != 1 || !strings.Contains(got[0], "job running: decided again when it ends") {
		t.Fatalf("while the job runs: %q", got)
	}
	queued[0]() // the job ends: both paths reconnected
	queued = nil
	rep = r.m.HandleEvents(ctx, uevent.Batch{})
	if len(rep.Jobs) != 1 || len(rep.Decisions) != 1 {
		t.Fatalf("after the job: jobs %+v, decisions %q", rep.Jobs, decisionWords(rep))
	}
	d := rep.Decisions[0]
	if d.Started || !strings.HasPrefix(d.Words, "no job: every path") || d.Events[0] != "remove block nvme0n1 (seq 2)" || d.Latency != 10*time.Millisecond {
		t.Errorf("the decision after the job: %+v (now %v)", d, r.clk.Now())
	}
	if len(queued) != 0 {
		t.Errorf("%d more jobs queued", len(queued))
	}
}

// Lost events: the loop reads every target at once, as a tick, counted;
// a second loss within the spacing is read at its end, not at once.
func TestEvents_ALossIsOneFullReadSpacedOut(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	_ = r.k.Disconnect("nvme1")
	before := len(r.k.Calls())
	r.k.TakeUevents() // lost
	rep := r.m.HandleEvents(ctx, uevent.Batch{Lost: []uevent.Loss{uevent.LossSocket}})
	if !rep.Full || len(rep.Tick.Connects) != 1 {
		t.Fatalf("first loss: full %v, tick connects %v", rep.Full, rep.Tick.Connects)
	}
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	r.clk.Step(time.Second / 2)
	rep = r.m.HandleEvents(ctx, uevent.Batch{Lost: []uevent.Loss{uevent.LossQueue}})
	if rep.Full {
		t.Fatal("a second loss within the spacing read everything at once")
	}
	if due := r.m.NextDue(); !due.Equal(r.clk.Now().Add(time.Second / 2)) {
		t.Fatalf("next due %v, want the end of the spacing", due)
	}
	r.clk.Step(time.Second / 2)
	if rep = r.m.HandleEvents(ctx, uevent.Batch{}); !rep.Full {
		t.Fatal("the owed full read did not run at the end of the spacing")
	}
	if !r.m.NextDue().IsZero() {
		t.Errorf("still due: %v", r.m.NextDue())
	}
}

// A repair the grace defers (a controller that contributes no path,
// connected a second ago) is decided again when the grace ends, not at
// the next tick.
func TestEvents_ADeferredRepairIsRevisitedWhenItsGraceEnds(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	_ = r.k.Disconnect("nvme1")
	r.m.HandleEvents(ctx, r.events()) // reconnected: nvme4, new
	r.k.TakeUevents()
	r.clk.Step(time.Second)
	r.k.DropLegs(4) // it contributes no path, a second old
	rep := r.m.HandleEvents(ctx, uevent.Batch{Events: []uevent.Event{{Seq: 9, Action: uevent.Change, Subsystem: "nvme",
		DevPath: "/devices/virtual/nvme-fabrics/ctl/nvme4", Received: r.clk.Now()}}})
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Started || len(rep.Jobs) != 1 || len(rep.Jobs[0].Outcomes) != 1 || rep.Jobs[0].Outcomes[0].Class != heal.ClassGrace {
		t.Fatalf("decisions: %q, jobs %+v", decisionWords(rep), rep.Jobs)
	}
	due := r.m.NextDue()
	if due.IsZero() {
		t.Fatalf("nothing due after a deferred repair; jobs %+v", rep.Jobs)
	}
	if w := due.Sub(r.clk.Now()); w <= 0 || w > heal.DefaultGrace {
		t.Fatalf("due in %s, want within the grace", w)
	}
	before := len(r.k.Calls())
	r.clk.Step(due.Sub(r.clk.Now()))
	rep = r.m.HandleEvents(ctx, uevent.Batch{})
	if len(rep.Decisions) == 0 || rep.Decisions[0].Events[0] != "revisit" || !rep.Decisions[0].Started {
		t.Fatalf("at the end of the grace: %q", decisionWords(rep))
	}
	if calls := r.callsSince(before); len(calls) == 0 || calls[0] != "delete nvme4" {
		t.Errorf("calls at the end of the grace: %q", calls)
	}
}

// Events the loop knows no target of (a loop device, another driver's
// controller in the owned scope) are counted and read nothing.
func TestEvents_ForeignObjectsAreNotRead(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	r.k.AddTarget(target("nqn.2014-08.io.other:c", "127.0.0.5"))
	if _, err := r.k.Connect(context.Background(), fabricsOpts("nqn.2014-08.io.other:c", "127.0.0.5")); err != nil {
		t.Fatal(err)
	}
	reads := r.tr.Reader().Counts()
	b := r.events()
	b.Events = append(b.Events, uevent.Event{Seq: 99, Action: uevent.Change, Subsystem: "block", DevPath: "/devices/virtual/block/loop0"})
	rep := r.m.HandleEvents(context.Background(), b)
	for _, d := range rep.Decisions {
		if d.Read || d.Started {
			t.Errorf("another driver's subsystem read or acted on: %+v", d)
		}
	}
	if rep.Unresolved != 1 {
		t.Errorf("unresolved %d, want the loop device's", rep.Unresolved)
	}
	if got := r.tr.Reader().Counts().Reads - reads.Reads; got != 0 {
		t.Errorf("%d attribute files read for events of no staged volume", got)
	}
	if _, ok := r.m.deps.Model.Snapshot().Volume("nqn.2014-08.io.other:c"); ok {
		t.Error("another driver's subsystem written into the model")
	}
}

func fabricsOpts(nqn, host string) fabrics.Options {
	return fabrics.Options{Transport: "tcp", Traddr: host, Trsvcid: "4420", NQN: nqn}
}

// The kernel sends a remove event before it drops the object's directory
// (in the lab a namespace head stayed readable for tens of milliseconds
// after its "remove block"): a read that still finds the removed object
// is followed by another shortly — not by the tick — which decides on
// what the kernel did; a read that no longer finds it is not.
func TestEvents_AReadThatStillFindsARemovedObjectIsRepeatedShortly(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	r.clk.Step(time.Second)
	early := uevent.Batch{Events: []uevent.Event{{Seq: 1, Action: uevent.Remove, Subsystem: "nvme",
		DevPath: "/devices/virtual/nvme-fabrics/ctl/nvme1", Received: r.clk.Now()}}}
	rep := r.m.HandleEvents(ctx, early)
	if got := decisionWords(rep); len(got) != 1 || !strings.Contains(got[0], "no job: every path of its staged volumes live") {
		t.Fatalf("the read before the kernel dropped nvme1: %q", got)
	}
	if due := r.m.NextDue(); !due.Equal(r.clk.Now().Add(removalSettle)) {
		t.Fatalf("NextDue = %v, want %v", due, r.clk.Now().Add(removalSettle))
	}
	if err := r.k.Disconnect("nvme1"); err != nil {
		t.Fatal(err)
	}
	r.k.TakeUevents() // already delivered above
	before := len(r.k.Calls())
	r.clk.Step(removalSettle)
	rep = r.m.HandleEvents(ctx, uevent.Batch{})
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Started || rep.Decisions[0].Events[0] != "revisit: nvme1 removed" || !slices.Equal(rep.Decisions[0].Seqs, []uint64{1}) ||
		!strings.HasPrefix(rep.Decisions[0].Words, "job started: missing paths: 127.0.0.2:4420") {
		t.Fatalf("the read after the kernel dropped nvme1: %q", decisionWords(rep))
	}
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	r.k.TakeUevents()
	if due := r.m.NextDue(); !due.IsZero() {
		t.Errorf("NextDue after the removal was read = %v, want none", due)
	}
}

// An event that adds a block device (a namespace's head, or a leg) calls
// for no job at once: the kernel adds the other controllers' legs one by
// one after it, and a controller whose leg is still on its way would be
// torn down as not contributing (seen in the lab, 220 ms after a rescan
// brought a namespace back). The target is decided on again addSettle
// later, on a fresh read: a controller that still lacks its leg then is
// repaired.
func TestEvents_AnAddedBlockDeviceWaitsForItsLegs(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	r.clk.Step(time.Minute)
	r.k.DropLegs(1)
	before := len(r.k.Calls())
	rep := r.m.HandleEvents(ctx, uevent.Batch{Events: []uevent.Event{{Seq: 20, Action: uevent.Add, Subsystem: "block",
		DevPath: "/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1", Received: r.clk.Now()}}})
	if got := decisionWords(rep); len(got) != 1 || !strings.Contains(got[0], "deferred 2s: a block device was just added") || rep.Decisions[0].Started {
		t.Fatalf("decision on the add: %q", got)
	}
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Fatalf("acted at the add: %q", calls)
	}
	if due := r.m.NextDue(); !due.Equal(r.clk.Now().Add(addSettle)) {
		t.Fatalf("NextDue = %v, want %v", due, r.clk.Now().Add(addSettle))
	}
	r.clk.Step(addSettle)
	rep = r.m.HandleEvents(ctx, uevent.Batch{})
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Started {
		t.Fatalf("after the settle: %q", decisionWords(rep))
	}
	if calls := r.callsSince(before); len(calls) == 0 || calls[0] != "delete nvme1" {
		t.Errorf("calls after the settle, the leg still missing: %q", calls)
	}
}

// A decision's log line names every event it answers by the kernel's
// sequence numbers, as ranges, bounded.
func TestSeqRanges(t *testing.T) {
	many := make([]uint64, 0, 40)
	for i := uint64(0); i < 40; i++ {
		many = append(many, 100+2*i)
	}
	for _, c := range []struct {
		in   []uint64
		want string
	}{
		{nil, ""},
		{[]uint64{970}, "970"},
		{[]uint64{970, 971, 972, 973, 980}, "970-973,980"},
		{[]uint64{5, 7, 8, 6}, "5,7-8,6"},
		{many, "100,102,104,106,108,110,112,114,116,118,120,122,124,126,128,130 and 24 more"},
	} {
		if got := seqRanges(c.in); got != c.want {
			t.Errorf("seqRanges(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
