package heal

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

// recorder is a Repairer that records what it was asked to tear down.
type recorder struct {
	calls []string
	err   error
}

func (r *recorder) Repair(_ context.Context, d Defect) ([]Path, error) {
	r.calls = append(r.calls, d.Key)
	if r.err != nil {
		return nil, r.err
	}
	return d.Teardown, nil
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newPolicy(t *testing.T, mode Mode, clk *clocktesting.FakeClock) *Policy {
	t.Helper()
	p, err := NewPolicy(Config{Mode: mode, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// notContributing is a ControllerNotContributing defect on endpoint port,
// its controller created at created.
func notContributing(port string, created time.Time) Defect {
	ep := "tcp 127.0.0.1:" + port
	return Defect{
		Kind: ControllerNotContributing, Scope: ScopeController, Key: ep,
		Subject:  "nvme-subsys0",
		Teardown: []Path{{Name: "nvme" + port[len(port)-1:], Endpoint: ep, State: "live", CreatedAt: created}},
	}
}

func verdicts(os []Outcome) []Verdict {
	var v []Verdict
	for _, o := range os {
		v = append(v, o.Verdict)
	}
	return v
}

func TestHeal_DefersAControllerConnected97msAgoThenRepairsOnceGraceHasPassed(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	d := notContributing("4421", t0.Add(-97*time.Millisecond))

	out := p.Heal(context.Background(), []Defect{d}, r)
	if diff := cmp.Diff([]Verdict{Deferred}, verdicts(out)); diff != "" {
		t.Fatalf("first tick (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(out[0].Reason, "grace: nvme1 is 97ms old") {
		t.Errorf("reason = %q", out[0].Reason)
	}
	if len(r.calls) != 0 {
		t.Fatalf("young controller torn down: %v", r.calls)
	}
	clk.Step(3 * time.Second)
	if out := p.Heal(context.Background(), []Defect{d}, r); out[0].Verdict != Deferred {
		t.Fatalf("still inside grace: %v", verdicts(out))
	}
	clk.Step(2 * time.Second) // 5.097 s old: past the 5 s grace, defect persists
	out = p.Heal(context.Background(), []Defect{d}, r)
	if diff := cmp.Diff([]Verdict{Repaired}, verdicts(out)); diff != "" {
		t.Fatalf("after grace (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"tcp 127.0.0.1:4421"}, r.calls); diff != "" {
		t.Errorf("repairs (-want +got):\n%s", diff)
	}
	if len(out[0].Removed) != 1 || out[0].Removed[0].Name != "nvme1" {
		t.Errorf("removed = %v", out[0].Removed)
	}
}

// Every defect of a call was inspected on one read of the target, taken
// before the call's first teardown: two controllers, each the remaining
// path of the other's co-tenants, both pass the co-tenant check on that
// read. Only the first is torn down; the second is decided again on the
// next read (found in the real kernel: a namespace's legs removed before
// its head made every live controller "not contributing" at once).
func TestHeal_OneTeardownPerCall(t *testing.T) {
	old := t0.Add(-time.Hour)
	p := newPolicy(t, ModeRepair, clocktesting.NewFakeClock(t0))
	r := &recorder{}
	out := p.Heal(context.Background(), []Defect{notContributing("4420", old), notContributing("4421", old)}, r)
	if diff := cmp.Diff([]Verdict{Repaired}, verdicts(out)); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"tcp 127.0.0.1:4420"}, r.calls); diff != "" {
		t.Errorf("repairs (-want +got):\n%s", diff)
	}
	// A refusal or a deferral after the teardown is still decided and
	// logged: only a second teardown waits.
	p2 := newPolicy(t, ModeRepair, clocktesting.NewFakeClock(t0))
	young := notContributing("4422", t0.Add(-time.Second))
	out = p2.Heal(context.Background(), []Defect{notContributing("4420", old), young}, &recorder{})
	if diff := cmp.Diff([]Verdict{Repaired, Deferred}, verdicts(out)); diff != "" {
		t.Errorf("with a young controller (-want +got):\n%s", diff)
	}
}

func TestHeal_CooldownKeys(t *testing.T) {
	old := t0.Add(-time.Hour)
	t.Run("three broken controller paths are three repairs, one per decision", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		p := newPolicy(t, ModeRepair, clk)
		r := &recorder{}
		ds := []Defect{notContributing("4421", old), notContributing("4422", old), notContributing("4423", old)}
		// Each call tears one down; the next call defers the repaired
		// key by its cooldown and repairs the next: one key's cooldown
		// holds back no other key.
		want := [][]Verdict{{Repaired}, {Deferred, Repaired}, {Deferred, Deferred, Repaired}}
		for i := range want {
			out := p.Heal(context.Background(), ds, r)
			if diff := cmp.Diff(want[i], verdicts(out)); diff != "" {
				t.Errorf("call %d (-want +got):\n%s", i+1, diff)
			}
			clk.Step(time.Second)
		}
		if diff := cmp.Diff([]string{"tcp 127.0.0.1:4421", "tcp 127.0.0.1:4422", "tcp 127.0.0.1:4423"}, r.calls); diff != "" {
			t.Errorf("repairs (-want +got):\n%s", diff)
		}
	})
	t.Run("two stale AmbiguousHead instances of one NQN are two repairs", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		p := newPolicy(t, ModeRepair, clk)
		r := &recorder{}
		head := func(inst, ctrl string) Defect {
			return Defect{Kind: AmbiguousHead, Scope: ScopeSubsystem, Key: inst, Subject: "nqn.2014-08.io.example:a",
				Teardown: []Path{{Name: ctrl, State: "live", CreatedAt: old}}}
		}
		ds := []Defect{head("nvme-subsys3", "nvme5"), head("nvme-subsys4", "nvme6")}
		if diff := cmp.Diff([]Verdict{Repaired}, verdicts(p.Heal(context.Background(), ds, r))); diff != "" {
			t.Errorf("first call (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]Verdict{Deferred, Repaired}, verdicts(p.Heal(context.Background(), ds, r))); diff != "" {
			t.Errorf("second call (-want +got):\n%s", diff)
		}
	})
	t.Run("the same key inside the cooldown is deferred, after it repaired again", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		p := newPolicy(t, ModeRepair, clk)
		r := &recorder{}
		d := notContributing("4421", old)
		p.Heal(context.Background(), []Defect{d}, r)
		clk.Step(10 * time.Second)
		// The re-created controller has a new name but the same endpoint.
		d2 := d
		d2.Teardown = []Path{{Name: "nvme9", Endpoint: d.Key, State: "live", CreatedAt: old}}
		out := p.Heal(context.Background(), []Defect{d2}, r)
		if out[0].Verdict != Deferred || !strings.HasPrefix(out[0].Reason, "cooldown:") {
			t.Fatalf("inside cooldown: %+v", out[0])
		}
		clk.Step(DefaultCooldown)
		if out := p.Heal(context.Background(), []Defect{d2}, r); out[0].Verdict != Repaired {
			t.Fatalf("after cooldown: %+v", out[0])
		}
		if len(r.calls) != 2 {
			t.Errorf("repairs = %v, want 2", r.calls)
		}
	})
}

func TestHeal_RefusesToStrandACoTenant(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	d := Defect{Kind: NamespaceMissing, Scope: ScopeSubsystem, Key: "nqn.2014-08.io.example:shared",
		Teardown:  []Path{{Name: "nvme0", State: "live"}, {Name: "nvme1", State: "live"}},
		CoTenants: []CoTenant{{Namespace: "nvme-subsys0 nsid 2", Device: "nvme0n2"}}}
	out := p.Heal(context.Background(), []Defect{d}, r)
	if out[0].Verdict != Refused || !strings.Contains(out[0].Reason, "nvme0n2") {
		t.Fatalf("outcome = %+v", out[0])
	}
	if len(r.calls) != 0 {
		t.Errorf("teardown ran: %v", r.calls)
	}
}

func TestHeal_NoNamespaceIsNotGatedOnCoTenants(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	d := Defect{Kind: NoNamespace, Scope: ScopeSubsystem, Key: "nqn.2014-08.io.example:empty",
		Teardown:  []Path{{Name: "nvme0", State: "live"}},
		CoTenants: []CoTenant{{Namespace: "listed by a shareable subsystem", Device: "none"}}}
	if out := p.Heal(context.Background(), []Defect{d}, r); out[0].Verdict != Repaired {
		t.Fatalf("outcome = %+v", out[0])
	}
}

// TestHeal_RefusesWhatTheIntentOwnerBlocks: while a record that may be a
// volume of the defect's target cannot be read, no kind is repaired, not
// even NoNamespace (the unreadable record may be a volume whose namespace
// has not appeared yet).
func TestHeal_RefusesWhatTheIntentOwnerBlocks(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	d := Defect{Kind: NoNamespace, Scope: ScopeSubsystem, Key: "nqn.2014-08.io.example:empty",
		Teardown: []Path{{Name: "nvme0", State: "live"}},
		Blocked:  "staged-volume record /state/volumes/vol-x.json: written by a newer pathmend (version 3)"}
	out := p.Heal(context.Background(), []Defect{d}, r)
	if out[0].Verdict != Refused || !strings.HasPrefix(out[0].Reason, "unreadable record: staged-volume record /state/volumes/vol-x.json") {
		t.Fatalf("outcome = %+v", out[0])
	}
	if len(r.calls) != 0 {
		t.Errorf("teardown ran: %v", r.calls)
	}
}

func TestHeal_ObserveTearsNothingDown(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeObserve, clk)
	r := &recorder{}
	d := notContributing("4421", t0.Add(-time.Hour))
	for range 3 {
		out := p.Heal(context.Background(), []Defect{d}, r)
		if out[0].Verdict != Observed || !strings.Contains(out[0].Reason, "would tear down nvme1") {
			t.Fatalf("outcome = %+v", out[0])
		}
		clk.Step(time.Second)
	}
	if len(r.calls) != 0 {
		t.Errorf("observe mode ran a teardown: %v", r.calls)
	}
	// Observe reaches the same refusals as repair would.
	d.CoTenants = []CoTenant{{Namespace: "ns2", Device: "nvme0n2"}}
	d.Kind = NamespaceMissing
	if out := p.Heal(context.Background(), []Defect{d}, r); out[0].Verdict != Refused {
		t.Errorf("observe refusal = %+v", out[0])
	}
}

func TestHeal_OffDecidesNothing(t *testing.T) {
	p := newPolicy(t, ModeOff, clocktesting.NewFakeClock(t0))
	r := &recorder{}
	if out := p.Heal(context.Background(), []Defect{notContributing("4421", time.Time{})}, r); out != nil || len(r.calls) != 0 {
		t.Errorf("off mode: %v, %v", out, r.calls)
	}
}

func TestHeal_ScopeCapAndNarrowestFirst(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p, err := NewPolicy(Config{Mode: ModeRepair, MaxScope: ScopeController, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	old := t0.Add(-time.Hour)
	wide := Defect{Kind: NoNamespace, Scope: ScopeSubsystem, Key: "nqn-a", Teardown: []Path{{Name: "nvme7", CreatedAt: old}}}
	narrow := notContributing("4421", old)
	out := p.Heal(context.Background(), []Defect{wide, narrow}, r)
	if diff := cmp.Diff([]Verdict{Repaired, Refused}, verdicts(out)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if out[0].Defect.Key != narrow.Key || !strings.Contains(out[1].Reason, "exceeds the cap") {
		t.Errorf("outcomes = %+v", out)
	}
}

func TestHeal_SkipsADefectAboutPathsAlreadyRemoved(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	old := t0.Add(-time.Hour)
	a := notContributing("4421", old)
	b := Defect{Kind: StaleEndpoint, Scope: ScopeController, Key: "other-key", Teardown: a.Teardown}
	out := p.Heal(context.Background(), []Defect{a, b}, r)
	if len(out) != 1 || len(r.calls) != 1 {
		t.Errorf("outcomes = %+v, repairs = %v; want one repair", out, r.calls)
	}
}

func TestHeal_FailedRepairStartsTheCooldownToo(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{err: errors.New("write delete_controller: no such device")}
	d := notContributing("4421", t0.Add(-time.Hour))
	if out := p.Heal(context.Background(), []Defect{d}, r); out[0].Verdict != Failed || out[0].Err == nil {
		t.Fatalf("outcome = %+v", out[0])
	}
	clk.Step(time.Second)
	if out := p.Heal(context.Background(), []Defect{d}, r); out[0].Verdict != Deferred {
		t.Fatalf("retry inside cooldown: %+v", out[0])
	}
}

func TestHeal_CooldownMemoryIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	for i := range 200 {
		d := notContributing("4421", time.Time{})
		d.Key = "endpoint-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		p.Heal(context.Background(), []Defect{d}, r)
	}
	clk.Step(relogInterval + time.Second)
	p.Heal(context.Background(), []Defect{notContributing("4499", time.Time{})}, r)
	p.cooldown.mu.Lock()
	n := len(p.cooldown.last)
	p.cooldown.mu.Unlock()
	if n != 1 {
		t.Errorf("cooldown entries after the window = %d, want 1", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.logged) > 1 {
		t.Errorf("log marks after the window = %d", len(p.logged))
	}
}

// captureLogs sends klog's output to the returned buffer for the test.
func captureLogs(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false"})
	klog.SetOutput(&buf)
	t.Cleanup(func() { klog.SetOutput(nil); fs.Set("logtostderr", "true") })
	return &buf
}

func TestHeal_LogsEachVerdictOnce(t *testing.T) {
	buf := captureLogs(t)

	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &recorder{}
	d := notContributing("4421", t0.Add(-100*time.Millisecond))
	for range 4 { // four ticks inside the grace: one deferral line
		p.Heal(context.Background(), []Defect{d}, r)
		clk.Step(time.Second)
	}
	clk.Step(time.Second)                        // 5.1 s old: past the grace
	p.Heal(context.Background(), []Defect{d}, r) // repaired
	klog.Flush()
	logs := buf.String()
	if n := strings.Count(logs, `verdict="deferred"`); n != 1 {
		t.Errorf("deferral logged %d times, want once:\n%s", n, logs)
	}
	if n := strings.Count(logs, `verdict="repaired"`); n != 1 {
		t.Errorf("repair logged %d times, want once:\n%s", n, logs)
	}
	for _, key := range []string{`defect="ControllerNotContributing"`, `scope="controller"`, `key="tcp 127.0.0.1:4421"`, `controllers="nvme1 (tcp 127.0.0.1:4421)"`, `reason=`} {
		if !strings.Contains(logs, key) {
			t.Errorf("verdict line lacks %s:\n%s", key, logs)
		}
	}
}

func TestNewPolicy_Validates(t *testing.T) {
	for _, cfg := range []Config{
		{Mode: "sometimes"},
		{Mode: ModeRepair, Grace: -time.Second},
		{Mode: ModeRepair, MaxScope: 7},
	} {
		if _, err := NewPolicy(cfg); err == nil {
			t.Errorf("NewPolicy(%+v) accepted", cfg)
		}
	}
}

func TestPlan_DecidesLikeRepairAndTouchesNothing(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	young := notContributing("4421", t0.Add(-time.Second))
	old := notContributing("4422", t0.Add(-time.Hour))
	stranding := Defect{Kind: NamespaceMissing, Scope: ScopeSubsystem, Key: "nqn-x",
		Teardown: []Path{{Name: "nvme7"}}, CoTenants: []CoTenant{{Namespace: "ns2", Device: "nvme3n2"}}}
	out := p.Plan([]Defect{stranding, young, old})
	if diff := cmp.Diff([]Verdict{Deferred, Observed, Refused}, verdicts(out)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if out[1].Reason != "would tear down nvme2 (tcp 127.0.0.1:4422)" {
		t.Errorf("reason = %q", out[1].Reason)
	}
	// Nothing was recorded: a real repair right after is not in cooldown.
	r := &recorder{}
	if o := p.Heal(context.Background(), []Defect{old}, r); o[0].Verdict != Repaired {
		t.Errorf("after a plan, heal = %+v", o[0])
	}
}

// Left and Mark share the table Heal keeps: a key marked by the iSCSI
// session heal defers an NVMe repair of the same key and the other way
// round, for the policy's one cooldown.
func TestPolicy_LeftAndMarkShareTheCooldownTable(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	if left, ago := p.Left("k"); left != 0 || ago != 0 {
		t.Fatalf("unmarked: left %s ago %s", left, ago)
	}
	p.Mark("k")
	clk.Step(20 * time.Second)
	if left, ago := p.Left("k"); left != DefaultCooldown-20*time.Second || ago != 20*time.Second {
		t.Fatalf("20 s after the mark: left %s ago %s", left, ago)
	}
	d := notContributing("4420", t0.Add(-time.Hour))
	d.Key = "k"
	if out := p.Heal(context.Background(), []Defect{d}, &recorder{}); out[0].Verdict != Deferred || !strings.HasPrefix(out[0].Reason, "cooldown:") {
		t.Fatalf("a Heal of the marked key: %+v", out[0])
	}
	clk.Step(DefaultCooldown)
	if left, _ := p.Left("k"); left != 0 {
		t.Fatalf("after the cooldown: left %s", left)
	}
	p.Heal(context.Background(), []Defect{d}, &recorder{})
	if left, _ := p.Left("k"); left != DefaultCooldown {
		t.Fatalf("after Heal repaired the key: left %s, want the full cooldown", left)
	}
}

func TestWindow_MarkAtCountsFromThePast(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	w := NewWindow(10*time.Minute, clk.Now)
	w.MarkAt("iscsid", t0.Add(-4*time.Minute))
	if left, ago := w.Left("iscsid"); left != 6*time.Minute || ago != 4*time.Minute {
		t.Fatalf("left %s ago %s", left, ago)
	}
}

// stepper is a recorder with a first step (a rescan) that cures the
// defect when cures is set.
type stepper struct {
	recorder
	steps int
	cures bool
}

func (s *stepper) FirstStep(d Defect) string {
	if d.Kind != NamespaceMissing {
		return ""
	}
	return "rescan nvme0, nvme1"
}

func (s *stepper) TryFirstStep(context.Context, Defect) (bool, error) {
	s.steps++
	s.calls = append(s.calls, "first step")
	return s.cures, nil
}

// A missing namespace in a subsystem shared with another volume: the
// teardown is refused (it would strand the co-tenant), but the rescan —
// which strands nobody — runs anyway, before the refusal, once per
// cooldown; the verdict line says both. A rescan that brings the
// namespace back is the repair.
func TestHeal_FirstStepRunsWhateverTheCoTenantGateSays(t *testing.T) {
	buf := captureLogs(t)

	clk := clocktesting.NewFakeClock(t0)
	p := newPolicy(t, ModeRepair, clk)
	r := &stepper{}
	d := Defect{Kind: NamespaceMissing, Scope: ScopeSubsystem, Key: "nqn.2014-08.io.example:shared",
		Teardown:  []Path{{Name: "nvme0", State: "live"}, {Name: "nvme1", State: "live"}},
		CoTenants: []CoTenant{{Namespace: "nvme-subsys0 nsid 1", Device: "nvme0n1"}}}
	var steps []int
	for range 130 { // 130 s of 1 s ticks, cooldown 60 s
		out := p.Heal(context.Background(), []Defect{d}, r)
		if out[0].Verdict != Refused || !strings.HasPrefix(out[0].Reason, "would leave co-tenants") {
			t.Fatalf("outcome = %+v", out[0])
		}
		if out[0].FirstStep != "" {
			steps = append(steps, int(clk.Since(t0)/time.Second))
			if out[0].FirstStep != "rescan nvme0, nvme1: the defect remains" {
				t.Errorf("first step = %q", out[0].FirstStep)
			}
		}
		clk.Step(time.Second)
	}
	if diff := cmp.Diff([]int{0, 60, 120}, steps); diff != "" {
		t.Errorf("rescans at seconds (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"first step", "first step", "first step"}, r.calls); diff != "" {
		t.Errorf("calls (-want +got) — a teardown ran:\n%s", diff)
	}
	klog.Flush()
	logs := buf.String()
	if n := strings.Count(logs, `firstStep="rescan nvme0, nvme1: the defect remains"`); n != 3 {
		t.Errorf("%d refusal lines name the rescan, want one per rescan (3):\n%s", n, logs)
	}
	if n := strings.Count(logs, `verdict="refused"`); n != 3 {
		t.Errorf("%d refusal lines in 130 ticks, want only the 3 that name a rescan:\n%s", n, logs)
	}
	if !strings.Contains(logs, `verdict="refused"`) || !strings.Contains(logs, `reason="would leave co-tenants with no accessible path: nvme-subsys0 nsid 1 (nvme0n1)"`) {
		t.Errorf("the refusal line does not say what was refused:\n%s", logs)
	}

	// The rescan brings the namespace back: that is the repair.
	r.cures = true
	clk.Step(time.Minute)
	out := p.Heal(context.Background(), []Defect{d}, r)
	if out[0].Verdict != Repaired || out[0].Reason != "rescan nvme0, nvme1: the defect is gone; nothing torn down" || len(out[0].Removed) != 0 {
		t.Fatalf("cured: %+v", out[0])
	}

	// Observe mode runs nothing, not even the rescan.
	obs := newPolicy(t, ModeObserve, clk)
	o := &stepper{}
	obs.Heal(context.Background(), []Defect{d}, o)
	if o.steps != 0 {
		t.Error("observe mode ran the first step")
	}
}
