package monitor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

const nqnA, nqnB = "nqn.2014-08.io.pathmend.test:a", "nqn.2014-08.io.pathmend.test:b"

// proberFunc adapts a function to Prober.
type proberFunc func(ctx context.Context, hostport string) error

func (f proberFunc) Reachable(ctx context.Context, hp string) error { return f(ctx, hp) }

// rig is the loop with the NVMe transport over a fake kernel, the intent
// owner over a record store, and a fake clock.
type rig struct {
	k     *nvmetest.Kernel
	clk   *clocktesting.FakeClock
	m     *Monitor
	tr    *nvmeheal.Transport
	store *volume.Store
	owner *intent.Owner
	// prober answers the transport's probes; a test may swap it.
	prober nvmeheal.Prober
}

// status is the model's entry of volume id after the last tick.
func (r *rig) status(id string) (model.Volume, bool) { return r.m.deps.Model.Snapshot().Volume(id) }

var testHost = fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"}

// set makes recs the node's records (state staged unless set).
func (r *rig) set(t *testing.T, recs ...volume.Record) {
	t.Helper()
	l, err := r.store.Scan()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range l.Records {
		if err := r.store.Delete(x.VolumeID); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range recs {
		if x.State == "" {
			x.State = volume.StateStaged
		}
		if err := r.store.Put(x); err != nil {
			t.Fatal(err)
		}
	}
}

func target(nqn string, hosts ...string) nvmetest.Target {
	t := nvmetest.Target{NQN: nqn, Namespaces: []nvmetest.Namespace{{Head: 1, NSID: 1, UUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427"}}, Ports: map[string]string{}}
	for i, h := range hosts {
		t.Ports[h+":4420"] = map[bool]string{true: "optimized", false: "non-optimized"}[i == 0]
	}
	return t
}

// rec is a staged record of volume id: namespace 1 of nqn over hosts,
// the first one optimized, in the normalized form Parse returns.
func rec(id, nqn string, hosts ...string) volume.Record {
	var eps []string
	for _, h := range hosts {
		eps = append(eps, h+":4420")
	}
	c, _, err := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": nqn, "endpoints": strings.Join(eps, ","), "optimizedEndpoints": eps[0], "nsid": "1"}, nil)
	if err != nil {
		panic(err)
	}
	return volume.Record{VolumeID: id, StagingPath: "/staging/" + id, Context: c, AccessType: volume.AccessMount, FSType: "ext4"}
}

func newRig(t *testing.T, mode heal.Mode, prober nvmeheal.Prober) *rig {
	t.Helper()
	// Jobs run inside Go: a tick reads its own jobs' outcomes.
	return newRigRun(t, mode, prober, func(f func()) { f() })
}

// newRigRun is a rig whose jobs run through runner.
func newRigRun(t *testing.T, mode heal.Mode, prober nvmeheal.Prober, runner func(func())) *rig {
	return newRigKernel(t, mode, prober, runner, nvmetest.NewKernel)
}

// newRigKernel is newRigRun on the fake kernel newKernel makes (one that
// rebuilds its tree on a change, or changes it in place as sysfs is).
func newRigKernel(t *testing.T, mode heal.Mode, prober nvmeheal.Prober, runner func(func()), newKernel func(string, clock.WithDelayedExecution) *nvmetest.Kernel) *rig {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	k := newKernel(t.TempDir(), clk)
	k.AddTarget(target(nqnA, "127.0.0.1", "127.0.0.2"))
	k.AddTarget(target(nqnB, "127.0.0.3", "127.0.0.4"))
	policy, err := heal.NewPolicy(heal.Config{Mode: mode, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if prober == nil {
		prober = proberFunc(func(context.Context, string) error { return nil })
	}
	store, err := volume.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: store, Clock: clk, Runner: runner})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{k: k, clk: clk, store: store, owner: owner, prober: prober}
	r.tr, err = nvmeheal.New(nvmeheal.Config{Owned: true, ConnectTimeout: 5 * time.Second}, nvmeheal.Deps{
		SysFS: k.FS(), Policy: policy, Connector: k, Host: testHost, Clock: clk,
		Prober: proberFunc(func(ctx context.Context, hp string) error { return r.prober.Reachable(ctx, hp) }),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.m, err = New(Config{}, Deps{
		SysFS: k.FS(), Intents: owner, Transports: []Transport{r.tr}, Model: model.New(),
		Policy: policy, Clock: clk,
		PathExists: func(p string) bool { return !strings.Contains(p, "gone") },
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// connectAged connects hostports of nqn and ages the controllers an hour.
func (r *rig) connectAged(t *testing.T, nqn string, hosts ...string) {
	t.Helper()
	for _, h := range hosts {
		if _, err := r.k.Connect(context.Background(), fabrics.Options{Transport: "tcp", Traddr: h, Trsvcid: "4420", NQN: nqn}); err != nil {
			t.Fatal(err)
		}
	}
	r.clk.Step(time.Hour)
	r.k.Refresh()
}

func (r *rig) callsSince(n int) []string { return r.k.Calls()[n:] }

// TestTick_RepairsFirstAndReconnectsInTheSameTick pins the order: the
// repair tears down the controller that contributes no path, and the
// reconcile pass of the same tick connects its endpoint again. Were the
// reconcile run before the repair, it would see the controller present,
// connect nothing, and the volume would end the tick a path short.
func TestTick_RepairsFirstAndReconnectsInTheSameTick(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.k.DropLegs(1)
	before := len(r.k.Calls())

	rep := r.m.Tick(context.Background())
	want := []string{"delete nvme1", "connect 127.0.0.2:4420"}
	if diff := cmp.Diff(want, r.callsSince(before)); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
	if len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Repaired {
		t.Errorf("outcomes = %+v", rep.Outcomes)
	}
	st, _ := r.status("vol-a")
	if live, _ := st.Live(); live != 2 || len(st.Paths) != 2 {
		t.Errorf("status after the tick = %+v", st)
	}
	// The next tick finds nothing to do.
	before = len(r.k.Calls())
	r.m.Tick(context.Background())
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("a healthy tick acted: %v", calls)
	}
}

func TestTick_GraceDefersAcrossTicksThenRepairs(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1")
	if _, err := r.k.Connect(context.Background(), fabrics.Options{Transport: "tcp", Traddr: "127.0.0.2", Trsvcid: "4420", NQN: nqnA}); err != nil {
		t.Fatal(err)
	}
	r.k.DropLegs(1) // connected just now, no leg yet
	before := len(r.k.Calls())
	rep := r.m.Tick(context.Background())
	if len(r.callsSince(before)) != 0 || len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Deferred {
		t.Fatalf("young controller: calls %v, outcomes %+v", r.callsSince(before), rep.Outcomes)
	}
	st, _ := r.status("vol-a")
	if len(st.Notes) == 0 || !strings.Contains(st.Notes[0], "repair deferred: grace:") {
		t.Errorf("notes = %v", st.Notes)
	}
	r.clk.Step(6 * time.Second)
	r.k.Refresh()
	r.m.Tick(context.Background())
	want := []string{"delete nvme1", "connect 127.0.0.2:4420"}
	if diff := cmp.Diff(want, r.callsSince(before)); diff != "" {
		t.Errorf("after the grace (-want +got):\n%s", diff)
	}
}

func TestTick_NoDuplicateConnectWhileTheKernelReconnects(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.k.SetState(1, "connecting")
	before := len(r.k.Calls())
	r.m.Tick(context.Background())
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("acted on a reconnecting controller: %v", calls)
	}
	st, _ := r.status("vol-a")
	if live, _ := st.Live(); live != 1 || !strings.Contains(st.Condition.Message, "nvme1 connecting") {
		t.Errorf("status = %+v", st)
	}
}

func TestTick_ReconnectsAMissingPathOptimizedFirst(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	// A restarted plugin: the record is there, the kernel has no paths.
	r.m.Tick(context.Background())
	want := []string{"connect 127.0.0.1:4420", "connect 127.0.0.2:4420"}
	if diff := cmp.Diff(want, r.k.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// TestTick_ASlowTargetDelaysNeitherTheTickNorOtherTargets: jobs run on
// their own goroutines. The probe of a dead target hangs; the tick
// returns at once, another target's missing path is connected meanwhile,
// the next tick reads that outcome and starts no second job on the busy
// target, and the dead target's outcome is read once its job ends; after
// that its full attempt is backed off: its jobs only recheck it with a
// probe bounded by RecheckTimeout, and connect nothing.
func TestTick_ASlowTargetDelaysNeitherTheTickNorOtherTargets(t *testing.T) {
	release := make(chan struct{})
	prober := proberFunc(func(ctx context.Context, hp string) error {
		if strings.HasPrefix(hp, "127.0.0.3") {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return errors.New("i/o timeout")
		}
		return nil
	})
	r := newRigRun(t, heal.ModeRepair, prober, func(f func()) { go f() })
	r.set(t, rec("vol-a", nqnA, "127.0.0.1"), rec("vol-b", nqnB, "127.0.0.3"))
	ctx := context.Background()
	r.m.Tick(ctx) // returns while vol-b's job hangs
	waitFor(t, "vol-a's path connected while vol-b's target hangs", func() bool { return contains(r.k.Calls(), "connect 127.0.0.1:4420") && r.owner.Jobs() == 1 })

	rep := r.m.Tick(ctx)
	if !contains(rep.Connects, nqnA+" 127.0.0.1:4420") {
		t.Errorf("second tick did not read vol-a's job: connects %v", rep.Connects)
	}
	if !contains(rep.Skipped, "nvme-tcp "+nqnB+": busy: monitor") {
		t.Errorf("second tick: skipped %v, want vol-b's target busy", rep.Skipped)
	}
	if st, _ := r.status("vol-b"); len(st.Notes) == 0 || !strings.Contains(st.Notes[0], "busy: monitor") {
		t.Errorf("vol-b notes = %v", st.Notes)
	}

	close(release)
	waitFor(t, "vol-b's job to end", func() bool { return r.owner.Jobs() == 0 })
	rep = r.m.Tick(ctx)
	if !contains(rep.Skipped, "127.0.0.3:4420: unreachable: i/o timeout") {
		t.Errorf("third tick: skipped %v, want vol-b's job's outcome", rep.Skipped)
	}
	// Backed off: the next tick's job only rechecks the dead target (a
	// probe bounded by RecheckTimeout, not ConnectTimeout) and connects
	// nothing; the tick after reads that it is still backed off.
	before := len(r.k.Calls())
	r.clk.Step(time.Second)
	skipped := r.m.Tick(ctx).Skipped
	waitFor(t, "the recheck job to end", func() bool { return r.owner.Jobs() == 0 })
	skipped = append(skipped, r.m.Tick(ctx).Skipped...) // the job may end before its tick reads the done ones
	waitFor(t, "the next recheck job to end", func() bool { return r.owner.Jobs() == 0 })
	// A job may still hold the lease a moment after it is counted done:
	// the target is then noted busy, which is no attempt either.
	backedOff := false
	for _, s := range skipped {
		switch {
		case strings.Contains(s, "127.0.0.3:4420: backed off"):
			backedOff = true
		case s != "nvme-tcp "+nqnB+": busy: monitor":
			t.Errorf("skipped %q", s)
		}
	}
	if len(r.callsSince(before)) != 0 || !backedOff {
		t.Errorf("fourth and fifth ticks: calls %v, skipped %v", r.callsSince(before), skipped)
	}
}

// waitFor polls cond (real time: the jobs run on goroutines) for up to
// ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestTick_ObserveModeTouchesNothing(t *testing.T) {
	r := newRig(t, heal.ModeObserve, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.k.DropLegs(1)
	before := len(r.k.Calls())
	rep := r.m.Tick(context.Background())
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("observe mode acted: %v", calls)
	}
	if len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Observed {
		t.Errorf("outcomes = %+v", rep.Outcomes)
	}
}

func TestTick_OrphanedRecordsAreReported(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	gone := rec("vol-gone", nqnA, "127.0.0.1")
	gone.StagingPath = "/staging/gone"
	r.set(t, gone)
	rep := r.m.Tick(context.Background())
	if diff := cmp.Diff([]string{"vol-gone"}, rep.Orphans); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
}

func TestRun_TicksUntilCancelled(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.m.Run(ctx) }()
	for r.m.LastTick().IsZero() {
		time.Sleep(time.Millisecond)
	}
	first := r.m.LastTick()
	for !r.clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	r.clk.Step(4 * time.Second) // past interval + jitter
	for !r.m.LastTick().After(first) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// TestTick_AControllerOfUnknownAddressIsNoReasonToConnectItsEndpoints:
// pathmend started while a controller of a volume's subsystem was
// reconnecting. Its address is not read until it is live (on Debian's
// 6.1 kernel the read can oops nvme-tcp), so it may be the kernel
// reconnecting either endpoint: neither is connected again, and the
// status says why. Once it is live its endpoint is known, and the other
// one is connected.
func TestTick_AControllerOfUnknownAddressIsNoReasonToConnectItsEndpoints(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1")
	r.k.SetState(0, "connecting")
	before := len(r.k.Calls())
	r.m.Tick(context.Background())
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("acted while a controller's address is unknown: %v", calls)
	}
	st, _ := r.status("vol-a")
	if live, _ := st.Live(); live != 0 || strings.Count(st.Condition.Message, nvme.AddressNotKnown) != 2 {
		t.Errorf("status = %+v, want no live path and %q for both endpoints", st, nvme.AddressNotKnown)
	}
	r.k.SetState(0, "live")
	r.m.Tick(context.Background())
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Errorf("once the controller is live (-want +got):\n%s", diff)
	}
}
