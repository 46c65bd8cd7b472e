package nvmeheal_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

const (
	nqnF = "nqn.2014-08.io.example:foreign" // the other driver's
	nqnP = "nqn.2014-08.io.pathmend.test:p" // the node plugin's
)

type proberFunc func(ctx context.Context, hostport string) error

func (f proberFunc) Reachable(ctx context.Context, hp string) error { return f(ctx, hp) }

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// rig is a node with a fake kernel, the node plugin's record store and
// intent owner, and the loop in companion mode's foreign scope with the
// NVMe transport healing what it learned.
type rig struct {
	k        *nvmetest.Kernel
	clk      *clocktesting.FakeClock
	records  *volume.Store
	learned  *companion.Store
	owner    *intent.Owner
	policy   *heal.Policy
	learner  *companion.Learner
	m        *monitor.Monitor
	metrics  *metrics.Metrics
	actions  companion.Actions
	down     atomic.Bool // the prober's answer
	beforeGo func()      // runs before each job (a record appearing meanwhile)
}

func twoPorts(nqn string) nvmetest.Target {
	return nvmetest.Target{NQN: nqn, Namespaces: []nvmetest.Namespace{{Head: 1, NSID: 1, UUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427"}},
		Ports: map[string]string{"127.0.0.1:4420": "optimized", "127.0.0.2:4420": "non-optimized"}}
}

func newRig(t *testing.T, mode heal.Mode, actions companion.Actions) *rig {
	t.Helper()
	r := &rig{clk: clocktesting.NewFakeClock(t0), actions: actions, metrics: metrics.New()}
	r.k = nvmetest.NewKernelInPlace(t.TempDir(), r.clk)
	r.k.AddTarget(twoPorts(nqnF))
	r.k.AddTarget(twoPorts(nqnP))
	var err error
	if r.policy, err = heal.NewPolicy(heal.Config{Mode: mode, Now: r.clk.Now}); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	if r.records, err = volume.NewStore(state); err != nil {
		t.Fatal(err)
	}
	if r.learned, err = companion.NewStore(state); err != nil {
		t.Fatal(err)
	}
	runner := func(f func()) {
		if r.beforeGo != nil {
			r.beforeGo()
		}
		f()
	}
	if r.owner, err = intent.New(intent.Config{}, intent.Deps{Store: r.records, Clock: r.clk, Runner: runner}); err != nil {
		t.Fatal(err)
	}
	r.restart(t)
	return r
}

// restart builds a new loop, NVMe transport and learner on the same state
// dir: a restarted pathmend companion.
func (r *rig) restart(t *testing.T) {
	t.Helper()
	var err error
	if r.learner, err = companion.NewLearner(r.k.FS(), r.learned, time.Hour); err != nil {
		t.Fatal(err)
	}
	tr, err := nvmeheal.New(nvmeheal.Config{Foreign: r.learner, Actions: r.actions, ConnectTimeout: 5 * time.Second, BackoffBase: 10 * time.Second},
		nvmeheal.Deps{SysFS: r.k.FS(), Policy: r.policy, Connector: r.k, Clock: r.clk,
			Prober: proberFunc(func(context.Context, string) error {
				if r.down.Load() {
					return errors.New("connection refused")
				}
				return nil
			}),
		})
	if err != nil {
		t.Fatal(err)
	}
	r.m, err = monitor.New(monitor.Config{Scope: monitor.Scope{Foreign: true}}, monitor.Deps{
		Intents: r.owner, Transports: []monitor.Transport{tr}, Model: model.New(), Policy: r.policy, Metrics: r.metrics,
		Clock: r.clk, SysFS: r.k.FS(),
	})
	if err != nil {
		t.Fatal(err)
	}
}

// driverOptions is how "the other driver" connects: its own host
// identity and tunables.
func driverOptions(nqn, host string) fabrics.Options {
	return fabrics.Options{Transport: "tcp", Traddr: host, Trsvcid: "4420", NQN: nqn,
		HostNQN: "nqn.2014-08.org.nvmexpress:uuid:driver", HostID: "d0d0d0d0-0000-4000-8000-000000000001",
		CtrlLossTmo: new(20), ReconnectDelay: new(2), FastIOFailTmo: new(5), KeepAliveTmo: new(7), NrIOQueues: new(2), QueueSize: new(64)}
}

// attach connects both ports of nqn the way another driver does, and
// ages the controllers past any grace.
func (r *rig) attach(t *testing.T, nqn string) {
	t.Helper()
	for _, h := range []string{"127.0.0.1", "127.0.0.2"} {
		if _, err := r.k.Connect(context.Background(), driverOptions(nqn, h)); err != nil {
			t.Fatal(err)
		}
	}
	r.clk.Step(time.Hour)
	r.k.Refresh()
}

func (r *rig) tick() monitor.Report {
	r.clk.Step(3 * time.Second)
	r.k.Refresh()
	return r.m.Tick(context.Background())
}

func (r *rig) callsSince(n int) []string { return r.k.Calls()[n:] }

// giveUp takes port 127.0.0.2 away long enough for the kernel to delete
// its controller, with a tick seeing it connecting in between.
func (r *rig) giveUp() {
	r.k.SetUnreachable("127.0.0.2:4420", true)
	r.down.Store(true)
	r.tick()
	r.k.GiveUp("127.0.0.2:4420")
}

// TestForeign_ReconnectsAGivenUpEndpointWithTheLearnedOptions: the kernel
// deleted a controller after its ctrl_loss_tmo; once the port answers,
// the endpoint is connected again with exactly the options the driver
// used. While it does not answer, it is backed off.
func TestForeign_ReconnectsAGivenUpEndpointWithTheLearnedOptions(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeReconnect: true})
	r.attach(t, nqnF)
	r.tick()
	r.giveUp()
	before := len(r.k.Calls())
	rep := r.tick()
	if len(rep.Connects) != 0 || len(rep.Skipped) != 1 || !strings.Contains(rep.Skipped[0], "unreachable") {
		t.Fatalf("port away: connects %v skipped %v, want one unreachable", rep.Connects, rep.Skipped)
	}
	if rep = r.tick(); len(rep.Skipped) != 1 || !strings.Contains(rep.Skipped[0], "backed off") {
		t.Fatalf("next tick: skipped %v, want backed off", rep.Skipped)
	}
	r.k.SetUnreachable("127.0.0.2:4420", false)
	r.down.Store(false)
	r.clk.Step(10 * time.Second)
	rep = r.tick()
	if diff := cmp.Diff([]string{nqnF + " tcp 127.0.0.2:4420"}, rep.Connects); diff != "" {
		t.Fatalf("connects (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	opts := r.k.ConnectOptions()
	if diff := cmp.Diff(driverOptions(nqnF, "127.0.0.2"), opts[len(opts)-1]); diff != "" {
		t.Errorf("reconnect options (-driver's +pathmend's):\n%s", diff)
	}
	// Live again: nothing more to do.
	before = len(r.k.Calls())
	if rep = r.tick(); len(rep.Connects)+len(rep.Skipped) != 0 || len(r.callsSince(before)) != 0 {
		t.Errorf("after the reconnect: %+v calls %v", rep, r.callsSince(before))
	}
}

// TestForeign_ADisconnectRightAfterAReconnectIsADisconnect: a controller
// companion mode connected again is live from the moment the connect
// returns. The driver disconnecting it before any tick saw it is a
// disconnect (forgotten), not another give-up to connect again.
func TestForeign_ADisconnectRightAfterAReconnectIsADisconnect(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeReconnect: true})
	r.attach(t, nqnF)
	r.tick()
	r.giveUp()
	r.k.SetUnreachable("127.0.0.2:4420", false)
	r.down.Store(false)
	if rep := r.tick(); !cmp.Equal(rep.Connects, []string{nqnF + " tcp 127.0.0.2:4420"}) {
		t.Fatalf("connects %v skipped %v", rep.Connects, rep.Skipped)
	}
	e := r.learner.Learned()[0].Endpoints[1]
	if e.LastState != nvme.StateLive || !e.GoneSince.IsZero() || e.Controller == "" {
		t.Fatalf("after the reconnect, before a tick saw it: %+v, want live and present", e)
	}
	if err := r.k.Disconnect(string(e.Controller)); err != nil {
		t.Fatal(err)
	}
	before := len(r.k.Calls())
	rep := r.tick()
	r.tick()
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("calls after the driver's disconnect: %v", calls)
	}
	if len(rep.Events) != 1 || !strings.HasPrefix(rep.Events[0], string(companion.Disconnected)+" ") {
		t.Errorf("events %v, want one disconnected", rep.Events)
	}
}

// TestForeign_ReconnectsAfterARestartBetweenLearningAndTheGiveUp: what was
// learned survives a restart of pathmend; the restarted one sees the
// controller connecting, then gone, and reconnects it.
func TestForeign_ReconnectsAfterARestartBetweenLearningAndTheGiveUp(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeReconnect: true})
	r.attach(t, nqnF)
	r.tick()
	r.restart(t)
	if got := r.learner.Learned(); len(got) != 1 || len(got[0].Endpoints) != 2 {
		t.Fatalf("learned after the restart: %+v", got)
	}
	r.giveUp()
	r.k.SetUnreachable("127.0.0.2:4420", false)
	r.down.Store(false)
	if rep := r.tick(); !cmp.Equal(rep.Connects, []string{nqnF + " tcp 127.0.0.2:4420"}) {
		t.Fatalf("connects %v skipped %v", rep.Connects, rep.Skipped)
	}
	opts := r.k.ConnectOptions()
	if diff := cmp.Diff(driverOptions(nqnF, "127.0.0.2"), opts[len(opts)-1]); diff != "" {
		t.Errorf("reconnect options (-driver's +pathmend's):\n%s", diff)
	}
}

// TestForeign_DoesNotReconnectWhatTheDriverDisconnected: a live controller
// the driver deleted is forgotten, never connected again.
func TestForeign_DoesNotReconnectWhatTheDriverDisconnected(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeReconnect: true, NVMeRepairs: true})
	r.attach(t, nqnF)
	r.tick()
	if err := r.k.Disconnect("nvme1"); err != nil {
		t.Fatal(err)
	}
	before := len(r.k.Calls())
	rep := r.tick()
	r.tick()
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("calls after the driver's disconnect: %v", calls)
	}
	if len(rep.Events) != 1 || !strings.HasPrefix(rep.Events[0], string(companion.Disconnected)+" ") {
		t.Errorf("events %v, want one disconnected", rep.Events)
	}
	if got := r.learner.Learned(); len(got) != 1 || len(got[0].Endpoints) != 1 {
		t.Errorf("learned %+v, want only the first endpoint", got)
	}
	// Both gone: the subsystem is forgotten, on disk too.
	if err := r.k.Disconnect("nvme0"); err != nil {
		t.Fatal(err)
	}
	r.tick()
	if subs, _, _ := r.learned.Load(); len(subs) != 0 || len(r.learner.Learned()) != 0 {
		t.Errorf("after the last disconnect: on disk %v, in memory %v", subs, r.learner.Learned())
	}
}

// TestForeign_ObserveAndDisabledActionsTouchNothing: observe mode, and
// repair mode with an action kind not enabled, decide and report but
// neither connect nor tear down.
func TestForeign_ObserveAndDisabledActionsTouchNothing(t *testing.T) {
	for _, tc := range []struct {
		mode    heal.Mode
		actions companion.Actions
		skip    string
		class   heal.Class
	}{
		{heal.ModeObserve, companion.Actions{NVMeReconnect: true, NVMeRepairs: true}, "observe mode: would reconnect", heal.ClassObserveMode},
		{heal.ModeRepair, companion.Actions{}, "not enabled (--nvme-reconnect)", heal.ClassActionDisabled},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			r := newRig(t, tc.mode, tc.actions)
			r.attach(t, nqnF)
			r.k.DropLegs(0) // a live controller that contributes nothing
			r.tick()
			r.giveUp()
			r.k.SetUnreachable("127.0.0.2:4420", false)
			r.down.Store(false)
			before := len(r.k.Calls())
			rep := r.tick()
			if calls := r.callsSince(before); len(calls) != 0 {
				t.Errorf("calls: %v", calls)
			}
			if len(rep.Skipped) != 1 || !strings.Contains(rep.Skipped[0], tc.skip) {
				t.Errorf("skipped %v, want %q", rep.Skipped, tc.skip)
			}
			if len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Observed || rep.Outcomes[0].Class != tc.class {
				t.Errorf("outcomes %+v, want one observed %s", rep.Outcomes, tc.class)
			}
		})
	}
}

// TestForeign_RepairTearsDownAndReconnectsWithTheLearnedOptions: a live
// controller with no leg (ControllerNotContributing) is torn down and
// connected again with the driver's options.
func TestForeign_RepairTearsDownAndReconnectsWithTheLearnedOptions(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeRepairs: true})
	r.attach(t, nqnF)
	r.k.DropLegs(1)
	before := len(r.k.Calls())
	rep := r.tick() // learns, then repairs
	if diff := cmp.Diff([]string{"delete nvme1", "connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
	if len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Repaired || rep.Outcomes[0].Defect.Kind != heal.ControllerNotContributing {
		t.Errorf("outcomes %+v", rep.Outcomes)
	}
	opts := r.k.ConnectOptions()
	if diff := cmp.Diff(driverOptions(nqnF, "127.0.0.2"), opts[len(opts)-1]); diff != "" {
		t.Errorf("reconnect options (-driver's +pathmend's):\n%s", diff)
	}
}

// TestForeign_RefusesATeardownThatLeavesANamespaceWithoutAPath: a dead
// controller that still carries the only leg of the namespace is not
// torn down (its head would go with it): every namespace counts as in
// use.
func TestForeign_RefusesATeardownThatLeavesANamespaceWithoutAPath(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeRepairs: true, NVMeReconnect: true})
	if _, err := r.k.Connect(context.Background(), driverOptions(nqnF, "127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	r.clk.Step(time.Hour)
	r.tick()
	r.k.SetState(0, "dead")
	before := len(r.k.Calls())
	rep := r.tick()
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("calls: %v", calls)
	}
	if len(rep.Outcomes) != 1 || rep.Outcomes[0].Verdict != heal.Refused || rep.Outcomes[0].Class != heal.ClassCoTenants {
		t.Errorf("outcomes %+v, want refused co_tenants", rep.Outcomes)
	}
}

// TestForeign_LeavesTheNodePluginsTargetsAlone: one owner per kernel object.
// A subsystem a staged-volume record names is never learned, reconnected
// or repaired by companion mode, and a record that appears after the
// tick planned (a NodeStage starting) makes the job do nothing.
func TestForeign_LeavesTheNodePluginsTargetsAlone(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeRepairs: true, NVMeReconnect: true})
	c, _, err := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": nqnP, "endpoints": "127.0.0.1:4420,127.0.0.2:4420", "nsid": "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.records.Put(volume.Record{VolumeID: "pv-1", State: volume.StateStaged, StagingPath: "/staging/pv-1", Context: c, AccessType: volume.AccessMount, FSType: "ext4"}); err != nil {
		t.Fatal(err)
	}
	r.attach(t, nqnP)
	r.attach(t, nqnF)
	r.k.DropLegs(1) // the plugin's second controller contributes nothing
	r.tick()
	for _, s := range r.learner.Learned() {
		if s.NQN == nqnP {
			t.Errorf("learned the node plugin's subsystem: %+v", s)
		}
	}
	before := len(r.k.Calls())
	if rep := r.tick(); len(rep.Outcomes) != 0 || len(r.callsSince(before)) != 0 {
		t.Errorf("acted on the plugin's subsystem: %+v calls %v", rep.Outcomes, r.callsSince(before))
	}

	// The foreign one: the plan sees a defect, but a NodeStage of it
	// writes its attaching record before the job takes the lease.
	r.k.DropLegs(3)
	r.beforeGo = func() {
		c, _, _ := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": nqnF, "endpoints": "127.0.0.1:4420", "nsid": "1"}, nil)
		if err := r.records.Put(volume.Record{VolumeID: "pv-2", State: volume.StateAttaching, StagingPath: "/staging/pv-2", Context: c, AccessType: volume.AccessMount, FSType: "ext4"}); err != nil {
			t.Error(err)
		}
	}
	before = len(r.k.Calls())
	rep := r.tick()
	if calls := r.callsSince(before); len(calls) != 0 {
		t.Errorf("calls after the record appeared: %v", calls)
	}
	if len(rep.Skipped) != 1 || !strings.Contains(rep.Skipped[0], string(heal.ClassOwnedByNodePlugin)) {
		t.Errorf("skipped %v, want owned by the node plugin", rep.Skipped)
	}
	// From the next tick on it is the plugin's: forgotten by companion mode.
	r.beforeGo = nil
	r.tick()
	if got := r.learner.Learned(); len(got) != 0 {
		t.Errorf("learned %+v, want nothing", got)
	}
}

// TestForeign_AnUnreadableLearnedFileBlocksItsSubsystem: a learned file a
// newer pathmend wrote makes companion mode leave its subsystem alone.
func TestForeign_AnUnreadableLearnedFileBlocksItsSubsystem(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeRepairs: true, NVMeReconnect: true})
	r.attach(t, nqnF)
	r.k.DropLegs(1)
	if err := os.WriteFile(r.learned.Path(nqnF), []byte(`{"version": 9, "nqn": "`+nqnF+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r.restart(t)
	before := len(r.k.Calls())
	r.tick()
	if rep := r.tick(); len(rep.Outcomes)+len(rep.Connects) != 0 || len(r.callsSince(before)) != 0 {
		t.Errorf("acted on a blocked subsystem: %+v calls %v", rep, r.callsSince(before))
	}
	if len(r.learner.Learned()) != 0 {
		t.Errorf("learned %+v", r.learner.Learned())
	}
}

// TestForeign_CountsItsDefectsAndVerdicts: in `pathmend companion` the
// learned subsystems' defects set pathmend_defects and their verdicts
// count in pathmend_repairs_total, as the node plugin's do.
func TestForeign_CountsItsDefectsAndVerdicts(t *testing.T) {
	r := newRig(t, heal.ModeObserve, companion.Actions{})
	m := r.metrics
	r.attach(t, nqnF)
	r.k.DropLegs(1)
	r.tick()
	want := `
# HELP pathmend_defects Defects found by the last diagnosis, by transport and kind.
# TYPE pathmend_defects gauge
pathmend_defects{kind="ControllerNotContributing",transport="nvme-tcp"} 1
# HELP pathmend_repairs_total Heal verdicts by transport, defect kind, scope, verdict (repaired, observed, deferred, refused, failed) and reason class.
# TYPE pathmend_repairs_total counter
pathmend_repairs_total{kind="ControllerNotContributing",reason="observe_mode",scope="controller",transport="nvme-tcp",verdict="observed"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "pathmend_defects", "pathmend_repairs_total"); err != nil {
		t.Error(err)
	}
}
