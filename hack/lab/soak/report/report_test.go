package report

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/hack/lab/soak/observe"
	"github.com/pathmend/pathmend/hack/lab/soak/plan"
	"github.com/pathmend/pathmend/hack/lab/soak/workload"
)

var t0 = time.Unix(1700000000, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

const nqn = "nqn.x:a"

var volA = observe.VolumeSpec{ID: "vol-a", NQN: nqn, NSID: 1, Paths: []observe.PathSpec{{ID: "p1"}, {ID: "p2"}}}

func obj(name string, healthy bool) observe.Object {
	return observe.Object{Key: name + "@1", Name: name, Target: nqn, Endpoint: "127.0.0.1:4420", State: "live", Healthy: healthy}
}

// sample builds a sample of vol-a's two paths and the given objects.
func sample(s float64, p1, p2 bool, objs ...observe.Object) observe.Sample {
	x := observe.Sample{At: at(s), Paths: map[string]observe.PathState{"vol-a/p1": {Up: p1}, "vol-a/p2": {Up: p2}},
		Devices: map[string]string{"vol-a": "nvme0n1"}, Objects: map[string]observe.Object{}}
	for _, o := range objs {
		x.Objects[o.Key] = o
	}
	return x
}

func input(tr *observe.Tracker) Input {
	return Input{
		Seed: 7, Start: t0, End: at(300), Tracker: tr,
		Volumes: []Volume{{Spec: volA, Target: nqn, Window: 60 * time.Second}},
	}
}

// A healthy controller that vanishes is a failure — unless the soak
// deleted it, or it went with the unstage of its target's last volume;
// one that vanished after a fault hit it between samples is set apart.
func TestBuild_HealthyTeardowns(t *testing.T) {
	c1, c2, c3, c4 := obj("nvme1", true), obj("nvme2", true), obj("nvme3", true), obj("nvme4", false)
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true, c1, c2, c3, c4))
	tr.Add(sample(10, true, true, c2, c3)) // nvme1 (healthy) and nvme4 (not) gone
	tr.Add(sample(20, true, true, c3))     // nvme2 gone: deleted by the soak
	tr.Add(sample(40, false, false))       // nvme3 gone: the unstage of the last volume
	in := input(tr)
	in.Faults = []FaultRun{{Fault: plan.Fault{ID: 1, Kind: plan.ControllerDelete}, Injected: at(15), Result: "done", Volumes: []string{"vol-a"}, Objects: []string{c2.Key}}}
	in.Actions = []Action{{At: at(1), What: "stage", Volume: "vol-a"}, {At: at(30), End: at(35), What: "unstage", Volume: "vol-a"}}
	in.Log = []LogLine{{At: at(5), Msg: "Heal verdict", KV: map[string]string{"verdict": "repaired", "defect": "ControllerNotContributing", "controllers": "nvme1 (tcp 127.0.0.1:4420)", "reason": "tore down nvme1"}}}
	r := Build(in)
	if len(r.Teardowns) != 1 || r.Teardowns[0].Object.Name != "nvme1" || !strings.Contains(r.Teardowns[0].Verdict, "ControllerNotContributing repaired") {
		t.Fatalf("teardowns %+v", r.Teardowns)
	}
	if r.Pass || r.Checks.HealthyTeardowns != 1 {
		t.Errorf("pass %v, checks %+v", r.Pass, r.Checks)
	}

	// A fault put on the path between the last sample and the teardown:
	// not judged.
	in.Faults = append(in.Faults, FaultRun{Fault: plan.Fault{ID: 2, Kind: plan.PortUnlink}, Injected: at(2), Result: "done", Volumes: []string{"vol-a"}})
	r = Build(in)
	if len(r.Teardowns) != 0 || len(r.Unverifiable) != 1 {
		t.Errorf("with a fault between the samples: teardowns %+v, unverifiable %+v", r.Teardowns, r.Unverifiable)
	}
}

// The unstage of one volume may not take a path another staged volume of
// the same target needs.
func TestBuild_UnstageOfACoTenantIsNoExcuse(t *testing.T) {
	volB := observe.VolumeSpec{ID: "vol-b", NQN: nqn, NSID: 2, Paths: volA.Paths}
	c := obj("nvme1", true)
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true, c))
	tr.Add(sample(10, true, true))
	in := input(tr)
	in.Volumes = append(in.Volumes, Volume{Spec: volB, Target: nqn, Window: time.Minute})
	in.Actions = []Action{
		{At: at(0), What: "stage", Volume: "vol-a"}, {At: at(0), What: "stage", Volume: "vol-b"},
		{At: at(5), End: at(6), What: "unstage", Volume: "vol-a"},
	}
	if r := Build(in); len(r.Teardowns) != 1 {
		t.Errorf("teardowns %+v: the unstage of vol-a left vol-b staged on the same subsystem", r.Teardowns)
	}
}

// A read-only remount is explained only by an every-path-down span at
// least as long as the volume's queueing window.
func TestBuild_ReadOnlyAgainstTheWindow(t *testing.T) {
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true))
	tr.Add(sample(10, false, false))
	tr.Add(sample(40, true, false))
	tr.Add(sample(100, false, false))
	tr.Add(sample(170, true, true))
	in := input(tr)
	in.ReadOnly = []ReadOnly{{Volume: "vol-a", At: at(41), Source: "kernel"}}
	r := Build(in)
	if len(r.ReadOnly) != 1 || r.ReadOnly[0].Explained || r.ReadOnly[0].AllDown != 30 || r.Checks.ReadOnlyUnexplained != 1 {
		t.Errorf("after 30 s down, window 60 s: %+v", r.ReadOnly)
	}
	in.ReadOnly = []ReadOnly{{Volume: "vol-a", At: at(165), Source: "kernel"}}
	r = Build(in)
	if !r.ReadOnly[0].Explained || r.Checks.ReadOnlyUnexplained != 0 {
		t.Errorf("after 65 s down, window 60 s: %+v", r.ReadOnly)
	}
}

func TestBuild_LatencyErrorWindowsAndHeals(t *testing.T) {
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true))
	tr.Add(sample(10, true, false))
	tr.Add(sample(24, true, true))
	tr.Add(sample(50, false, true))
	tr.Add(sample(53, true, true))
	in := input(tr)
	in.Faults = []FaultRun{
		{Fault: plan.Fault{ID: 1, Kind: plan.PortUnlink, Hold: 10 * time.Second}, Injected: at(9), Undone: at(19), Result: "done", Volumes: []string{"vol-a"}},
		{Fault: plan.Fault{ID: 2, Kind: plan.PortUnlink}, Injected: at(49), Undone: at(51), Result: "done", Volumes: []string{"vol-a"}},
		{Fault: plan.Fault{ID: 3, Kind: plan.StuckSession}, Result: "skipped", Note: "not reached"},
	}
	in.Volumes[0].Stats = workload.Stats{Writes: 100, WriteErrors: 3, Errors: []workload.Event{
		{At: at(11), Op: workload.OpWrite, Block: 1, Err: "EIO"},
		{At: at(14), Op: workload.OpWrite, Block: 2, Err: "EIO"},
		{At: at(200), Op: workload.OpRead, Block: 3, Err: "EIO"},
	}}
	in.Log = []LogLine{
		{At: at(20), Msg: "Reconnected path", KV: map[string]string{"nqn": nqn, "endpoint": "127.0.0.1:4420"}},
		{At: at(21), Msg: "iSCSI session verdict", KV: map[string]string{"verdict": "repaired", "kick": "logout-login", "session": "session3"}},
		{At: at(22), Msg: "Heal verdict", KV: map[string]string{"verdict": "deferred", "defect": "ControllerNotContributing"}},
	}
	r := Build(in)
	if d := cmp.Diff(Latency{N: 2, P50: 2, P99: 5, Max: 5}, r.HealLatency[string(plan.PortUnlink)]); d != "" {
		t.Errorf("latency (-want +got):\n%s", d)
	}
	want := map[string]map[string]int{
		"reconnect":                 {"repaired": 1},
		"iscsi logout-login":        {"repaired": 1},
		"ControllerNotContributing": {"deferred": 1},
	}
	if d := cmp.Diff(want, r.Heals); d != "" {
		t.Errorf("heals (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]map[string]int{"nvme-port-unlink": {"done": 2}, "iscsi-stuck-session": {"skipped": 1}}, r.Faults); d != "" {
		t.Errorf("faults (-want +got):\n%s", d)
	}
	ws := r.Volumes[0].ErrorWindows
	if len(ws) != 2 || ws[0].Errors != 2 || !slices.Equal(ws[0].Faults, []string{"#1 nvme-port-unlink"}) || len(ws[1].Faults) != 0 {
		t.Errorf("error windows %+v", ws)
	}
	if !r.Pass {
		t.Errorf("failures %v", r.Failures)
	}
	var text, js bytes.Buffer
	r.Text(&text)
	if err := r.JSON(&js); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"soak PASS: seed 7", "nvme-port-unlink", "I/O errors", "no fault on its paths"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(js.String(), `"healthyTeardowns": 0`) {
		t.Errorf("JSON:\n%s", js.String())
	}
}

// A failed run prints its seed and the timeline around the failure.
func TestText_FailureShowsSeedAndTimeline(t *testing.T) {
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true))
	in := input(tr)
	in.Orphans = []string{"controller nvme5 to nqn.x:a"}
	in.Faults = []FaultRun{{Fault: plan.Fault{ID: 1, Kind: plan.PortUnlink}, Injected: at(280), Undone: at(290), Result: "done", Volumes: []string{"vol-a"}}}
	r := Build(in)
	var b bytes.Buffer
	r.Text(&b)
	for _, want := range []string{"soak FAIL", "SOAK_SEED=7", "orphaned at the end: controller nvme5", "timeline around each failure", "fault #1 nvme-port-unlink at"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestParseLog_ReadsTheJSONSchema(t *testing.T) {
	in := `{"ts":1700000005000.5,"caller":"heal/policy.go:254","msg":"Heal verdict","v":0,"verdict":"repaired","defect":"NoNamespace","controllers":"nvme1 (tcp a:1),nvme2 (tcp b:2)"}
panic: not json
{"ts":1700000006000,"caller":"monitor/tick.go:173","msg":"Path not reconnected","v":0,"nqn":"n","endpoint":"e:1","retryAt":"x","err":"refused"}
`
	lines, err := ParseLog(strings.NewReader(in))
	if err != nil || len(lines) != 2 {
		t.Fatalf("lines %+v, %v", lines, err)
	}
	hs := Heals(lines)
	want := []Heal{
		{At: time.Unix(1700000005, 500000), Kind: "NoNamespace", Verdict: "repaired", Names: []string{"nvme1", "nvme2"}},
		{At: time.Unix(1700000006, 0), Kind: "reconnect", Verdict: "failed", Reason: "e:1: refused"},
	}
	if d := cmp.Diff(want, hs, cmpTime); d != "" {
		t.Errorf("heals (-want +got):\n%s", d)
	}
}

var cmpTime = cmp.Comparer(func(a, b time.Time) bool { d := a.Sub(b); return d < time.Millisecond && d > -time.Millisecond })

// A volume's every-path-down spans in the report are the run's: the setup
// before the faults start and the unstages after the end are cut off, and
// a span still open at the end ends there.
func TestClip_KeepsTheRunsPartOfEachSpan(t *testing.T) {
	spans := []observe.Span{
		{From: at(0), To: at(10)},  // setup, cut to 5–10
		{From: at(20), To: at(30)}, // inside
		{From: at(50), To: at(55)}, // after the end: gone
		{From: at(38)},             // open: ends at the end
	}
	got := clip(spans, at(5), at(40))
	want := []observe.Span{{From: at(5), To: at(10)}, {From: at(20), To: at(30)}, {From: at(38), To: at(40)}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("clip (-want +got):\n%s", d)
	}
}

// A kernel oops or BUG during the run fails it: the kernel's state, and
// with it every other check, cannot be trusted after one.
func TestBuild_AKernelCrashFailsTheRun(t *testing.T) {
	in := Input{Seed: 1, Start: at(0), End: at(60), Kernel: []Event{
		{At: at(10), What: "kernel: nvme nvme0: starting error recovery"},
		{At: at(20), What: "kernel: BUG: kernel NULL pointer dereference, address: 0000000000000038"},
		{At: at(20), What: "kernel: Oops: 0000 [#1] PREEMPT SMP NOPTI"},
	}}
	r := Build(in)
	if r.Pass {
		t.Fatal("a run with a kernel oops passed")
	}
	if len(r.KernelCrashes) != 2 {
		t.Errorf("kernel crashes %v, want the BUG and the Oops lines", r.KernelCrashes)
	}
}

// Every CSI call made more than once and every retry the soak reports is
// listed with its cause and counted in the verdict line.
func TestBuild_CountsRetriesWithTheirCauses(t *testing.T) {
	tr := observe.NewTracker([]observe.VolumeSpec{volA})
	tr.Add(sample(0, true, true))
	in := input(tr)
	in.Actions = []Action{
		{At: at(1), What: "stage", Volume: "vol-a"},
		{At: at(50), What: "stage", Volume: "vol-a", Attempts: 3, FirstErr: "rpc error: code = Unavailable"},
	}
	in.Retries = []string{"fault #4: attempt 1 at the stuck session lost the race: LOGGED_IN again"}
	r := Build(in)
	want := []string{"stage vol-a at 50s: 3 attempts; the first failed: rpc error: code = Unavailable", in.Retries[0]}
	if d := cmp.Diff(want, r.Retries); d != "" || r.RetryCount != 2 {
		t.Errorf("retries (count %d):\n%s", r.RetryCount, d)
	}
	var b bytes.Buffer
	r.Text(&b)
	if first, _, _ := strings.Cut(b.String(), "\n"); !strings.HasSuffix(first, "; 2 retries") {
		t.Errorf("verdict line %q does not count the retries", first)
	}
}
