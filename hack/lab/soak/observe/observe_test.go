package observe

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
)

const nqnA = "nqn.2024-01.io.pathmend.lab:soak-a"

var (
	t0   = time.Unix(1700000000, 0)
	volA = VolumeSpec{ID: "vol-a1", NQN: nqnA, NSID: 1, Paths: []PathSpec{{ID: "opt", Addr: "127.0.0.1", Port: 4420}, {ID: "nonopt", Addr: "127.0.0.2", Port: 4421}}}
	volI = VolumeSpec{ID: "vol-i", IQN: "iqn.x:t", LUN: 0, Paths: []PathSpec{{ID: "direct", Addr: "127.0.0.1", Port: 3260}, {ID: "proxy", Addr: "127.0.0.3", Port: 3260}}}
)

func ctrl(n int, state nvme.ControllerState, addr, svc string) nvme.Controller {
	name := nvme.ControllerName("nvme" + string(rune('0'+n)))
	return nvme.Controller{Name: name, Subsystem: "nvme-subsys0", State: state, Transport: "tcp",
		Address: nvme.Address{Traddr: addr, Trsvcid: svc}, SubsysNQN: nqnA, CreatedAt: t0.Add(time.Duration(n) * time.Second)}
}

// twoPaths is subsystem A with controllers nvme0 (opt) and nvme1
// (non-opt); legs lists which have a leg to nsid 1, and in which state.
func twoPaths(s0, s1 nvme.ControllerState, legs map[nvme.ControllerName]nvme.ANAState) *nvme.Host {
	ns := nvme.Namespace{Subsystem: "nvme-subsys0", Head: "nvme0n1", NSID: 1}
	for _, c := range []nvme.ControllerName{"nvme0", "nvme1"} {
		if a, ok := legs[c]; ok {
			ns.Paths = append(ns.Paths, nvme.Path{Controller: c, Device: nvme.DeviceName(string(c) + "n1"), ANAState: a})
		}
	}
	h := &nvme.Host{
		Controllers: []nvme.Controller{ctrl(0, s0, "127.0.0.1", "4420"), ctrl(1, s1, "127.0.0.2", "4421")},
		Subsystems:  []nvme.Subsystem{{Name: "nvme-subsys0", NQN: nqnA, Controllers: []nvme.ControllerName{"nvme0", "nvme1"}}},
	}
	if len(ns.Paths) > 0 || legs != nil {
		h.Subsystems[0].Namespaces = []nvme.Namespace{ns}
	}
	return h
}

func TestTake_NVMePathsAndControllerHealth(t *testing.T) {
	h := twoPaths(nvme.StateLive, nvme.StateLive, map[nvme.ControllerName]nvme.ANAState{"nvme0": nvme.ANAOptimized})
	s := Take(t0, h, nil, []VolumeSpec{volA})
	want := map[string]PathState{
		"vol-a1/opt":    {Up: true, Detail: "nvme0 live optimized"},
		"vol-a1/nonopt": {Detail: "nvme1 live, no leg"},
	}
	if d := cmp.Diff(want, s.Paths); d != "" {
		t.Errorf("paths (-want +got):\n%s", d)
	}
	var healthy, sick []string
	for _, o := range s.Objects {
		if o.Healthy {
			healthy = append(healthy, o.Name)
		} else {
			sick = append(sick, o.Name+": "+o.Why)
		}
	}
	if d := cmp.Diff([]string{"nvme0"}, healthy); d != "" {
		t.Errorf("healthy (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"nvme1: no leg to nsid 1"}, sick); d != "" {
		t.Errorf("not healthy (-want +got):\n%s", d)
	}
	if s.Devices["vol-a1"] != "nvme0n1" {
		t.Errorf("device %q", s.Devices["vol-a1"])
	}

	h = twoPaths(nvme.StateConnecting, nvme.StateLive, map[nvme.ControllerName]nvme.ANAState{"nvme0": nvme.ANAOptimized, "nvme1": nvme.ANAInaccessible})
	s = Take(t0, h, nil, []VolumeSpec{volA})
	if s.Paths["vol-a1/opt"].Up || s.Paths["vol-a1/nonopt"].Up {
		t.Errorf("connecting and inaccessible paths up: %+v", s.Paths)
	}
	s = Take(t0, &nvme.Host{}, nil, []VolumeSpec{volA})
	if d := cmp.Diff(PathState{Detail: "no controller"}, s.Paths["vol-a1/opt"]); d != "" {
		t.Errorf("no controller (-want +got):\n%s", d)
	}
}

func session(id int, state iscsi.SessionState, addr string, disk string, lun iscsi.DeviceState) iscsi.Session {
	return iscsi.Session{
		ID: iscsi.SessionID(id), State: state, TargetName: "iqn.x:t",
		Connections: []iscsi.Connection{{PersistentAddress: addr, PersistentPort: 3260}},
		LUNs:        []iscsi.LUN{{Address: iscsi.SCSIAddress{LUN: 0}, State: lun, Disk: disk}},
	}
}

func TestTake_ISCSIPathsNeedALoggedInSessionARunningDiskAndTheMap(t *testing.T) {
	snap := &iscsi.Snapshot{
		Sessions: []iscsi.Session{
			session(1, iscsi.SessionLoggedIn, "127.0.0.1", "sda", iscsi.DeviceRunning),
			session(2, iscsi.SessionFailed, "127.0.0.3", "sdb", "blocked"),
		},
		Maps: []iscsi.MultipathMap{{Device: "dm-0", Slaves: []string{"sda", "sdb"}}},
	}
	s := Take(t0, nil, snap, []VolumeSpec{volI})
	want := map[string]PathState{
		"vol-i/direct": {Up: true, Detail: "session1 LOGGED_IN, sda in dm-0"},
		"vol-i/proxy":  {Detail: "session2 FAILED, sdb blocked"},
	}
	if d := cmp.Diff(want, s.Paths); d != "" {
		t.Errorf("paths (-want +got):\n%s", d)
	}
	if !s.Objects["session1"].Healthy || s.Objects["session2"].Healthy {
		t.Errorf("objects %+v", s.Objects)
	}
	if s.Devices["vol-i"] != "dm-0" {
		t.Errorf("device %q", s.Devices["vol-i"])
	}
}

func sample(at time.Duration, opt, nonopt bool, dev string, objs ...Object) Sample {
	s := Sample{At: t0.Add(at), Paths: map[string]PathState{
		"vol-a1/opt": {Up: opt}, "vol-a1/nonopt": {Up: nonopt},
	}, Devices: map[string]string{"vol-a1": dev}, Objects: map[string]Object{}}
	for _, o := range objs {
		s.Objects[o.Key] = o
	}
	return s
}

func TestTracker_SpansAllDownGoneAndReplaced(t *testing.T) {
	c0 := Object{Key: "nvme0@1", Name: "nvme0", State: "live", Healthy: true}
	c1 := Object{Key: "nvme1@2", Name: "nvme1", State: "live", Healthy: true}
	tr := NewTracker([]VolumeSpec{volA})
	s := time.Second
	tr.Add(sample(0, true, true, "nvme0n1", c0, c1))
	tr.Add(sample(1*s, true, false, "nvme0n1", c0))    // nvme1 gone while healthy
	tr.Add(sample(2*s, false, false, "", c0))          // every path down, the head gone
	tr.Add(Sample{At: t0.Add(3 * s), Err: errTest})    // a failed read changes nothing
	tr.Add(sample(5*s, true, false, "nvme0n2", c0))    // back on a new head
	tr.Add(sample(6*s, true, true, "nvme0n2", c0, c1)) // the second path back
	if d := cmp.Diff([]Span{{From: t0.Add(1 * s), To: t0.Add(6 * s)}}, tr.PathDown["vol-a1/nonopt"]); d != "" {
		t.Errorf("nonopt down (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]Span{{From: t0.Add(2 * s), To: t0.Add(5 * s)}}, tr.AllDown["vol-a1"]); d != "" {
		t.Errorf("all down (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]Gone{{Object: c1, LastSeen: t0, NotSeen: t0.Add(s)}}, tr.Gone); d != "" {
		t.Errorf("gone (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]Replaced{{Volume: "vol-a1", From: "nvme0n1", To: "nvme0n2", At: t0.Add(5 * s)}}, tr.Replaced); d != "" {
		t.Errorf("replaced (-want +got):\n%s", d)
	}
	if tr.Samples != 5 || tr.MaxGap != 3*s {
		t.Errorf("samples %d, max gap %s", tr.Samples, tr.MaxGap)
	}
	for _, tc := range []struct {
		at   time.Duration
		want time.Duration
		ok   bool
	}{
		{0, 0, true},         // all up already
		{1 * s, 6 * s, true}, // down from 1 s, both up at 6 s
		{2500 * time.Millisecond, 6 * s, true},
		{7 * s, 7 * s, true},
	} {
		got, ok := tr.AllUpAt("vol-a1", t0.Add(tc.at))
		if ok != tc.ok || (ok && !got.Equal(t0.Add(tc.want))) {
			t.Errorf("AllUpAt(%s) = %v %v, want %s %v", tc.at, got.Sub(t0), ok, tc.want, tc.ok)
		}
	}
	if sp, ok := tr.DownAt("vol-a1", t0.Add(3*s)); !ok || sp.Len(time.Time{}) != 3*s {
		t.Errorf("DownAt(3s) = %+v %v", sp, ok)
	}
}

// A path that never comes back has no all-up time.
func TestTracker_AllUpAtNeedsEveryPath(t *testing.T) {
	tr := NewTracker([]VolumeSpec{volA})
	tr.Add(sample(0, true, false, "nvme0n1"))
	tr.Add(sample(time.Second, true, false, "nvme0n1"))
	if at, ok := tr.AllUpAt("vol-a1", t0); ok {
		t.Errorf("AllUpAt = %v, want none", at)
	}
}

var errTest = &testErr{}

type testErr struct{}

func (*testErr) Error() string { return "read failed" }
