package nvme

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

func intp(v int) *int { return &v }

func TestTimeoutsOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    volume.NVMeTCP
		want Timeouts
	}{
		{"nothing set: never give up, fail I/O after 10 min, reconnect every 5 s", volume.NVMeTCP{}, Timeouts{-1, 5, 600}},
		{"a finite ctrlLossTmo ends the wait itself: fast fail off", volume.NVMeTCP{CtrlLossTmo: intp(1800)}, Timeouts{1800, 5, -1}},
		{"-1 set explicitly", volume.NVMeTCP{CtrlLossTmo: intp(-1)}, Timeouts{-1, 5, 600}},
		{"every key set", volume.NVMeTCP{CtrlLossTmo: intp(60), ReconnectDelay: intp(2), FastIOFailTmo: intp(10)}, Timeouts{60, 2, 10}},
		{"fast fail off explicitly", volume.NVMeTCP{FastIOFailTmo: intp(-1)}, Timeouts{-1, 5, -1}},
	} {
		if got := TimeoutsOf(&tc.n); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// The defaults reach the connect; the kernel's fast-fail default (off) is
// not sent.
func TestConnectOptions_Defaults(t *testing.T) {
	host := fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001", ID: "00000000-0000-4000-8000-000000000001"}
	ep := volume.Endpoint{Host: "127.0.0.1", Port: 4420}
	for _, tc := range []struct {
		n    volume.NVMeTCP
		want string
	}{
		{volume.NVMeTCP{NQN: "nqn.2024-01.io.example:a"}, "ctrl_loss_tmo=-1,reconnect_delay=5,fast_io_fail_tmo=600"},
		{volume.NVMeTCP{NQN: "nqn.2024-01.io.example:a", CtrlLossTmo: intp(1200)}, "ctrl_loss_tmo=1200,reconnect_delay=5"},
		{volume.NVMeTCP{NQN: "nqn.2024-01.io.example:a", ReconnectDelay: intp(2), FastIOFailTmo: intp(30)}, "ctrl_loss_tmo=-1,reconnect_delay=2,fast_io_fail_tmo=30"},
	} {
		s := ConnectOptions(&tc.n, ep, host, volume.Secrets{}).String()
		if !strings.Contains(s, tc.want) || (tc.n.CtrlLossTmo != nil && strings.Contains(s, "fast_io_fail_tmo")) {
			t.Errorf("options %q, want %q", s, tc.want)
		}
	}
}

func TestShortCtrlLossTmo(t *testing.T) {
	for v, warn := range map[int]bool{-1: false, 5: true, 599: true, 600: false, 3600: false} {
		if got := ShortCtrlLossTmo(&volume.NVMeTCP{CtrlLossTmo: intp(v)}) != ""; got != warn {
			t.Errorf("ctrlLossTmo %d: warned %t, want %t", v, got, warn)
		}
	}
	if ShortCtrlLossTmo(&volume.NVMeTCP{}) != "" {
		t.Error("warned about an unset ctrlLossTmo")
	}
}

// Controllers connected with the kernel's defaults (600, 10, off) are
// brought to the staged volume's timeouts, reconnect_delay first; once
// aligned there is nothing left to write. A head that offers
// delayed_removal_secs (newer kernels) gets it; 6.1's heads do not have
// it, and nothing is written there.
func TestTimeoutTunes(t *testing.T) {
	topo := nvmetest.Topology{Subsystems: []nvmetest.Subsystem{{
		Instance: 0, NQN: "nqn.2024-01.io.example:a",
		Namespaces: []nvmetest.Namespace{{Head: 1, NSID: 1}, {Head: 2, NSID: 2}},
		Controllers: []nvmetest.Controller{
			{Instance: 0, Traddr: "127.0.0.1", Trsvcid: "4420", Legs: legs("optimized", 1, 2)},
			{Instance: 1, Traddr: "127.0.0.1", Trsvcid: "4421", Legs: legs("non-optimized", 1, 2)},
		},
	}}}
	f := topo.Fixture()
	f = withValue(f, subsysDev(0)+"/nvme0n1/delayed_removal_secs", "0")
	fsys := materialize(t, f)
	eps := []volume.Endpoint{{Host: "127.0.0.1", Port: 4420}, {Host: "127.0.0.1", Port: 4421}}
	vol1 := TuneTarget{Expectation: Expectation{VolumeID: "pv-1", NQN: "nqn.2024-01.io.example:a", Endpoints: eps, NSID: 1}, Timeouts: TimeoutsOf(&volume.NVMeTCP{})}
	tunes, conflicts := TimeoutTunes(fsys, mustRead(t, fsys), []TuneTarget{vol1})
	c := "class/nvme/nvme"
	want := []Tune{
		{c + "0/reconnect_delay", "10", "5"}, {c + "0/ctrl_loss_tmo", "600", "-1"}, {c + "0/fast_io_fail_tmo", "off", "600"},
		{c + "1/reconnect_delay", "10", "5"}, {c + "1/ctrl_loss_tmo", "600", "-1"}, {c + "1/fast_io_fail_tmo", "off", "600"},
		{"block/nvme0n1/delayed_removal_secs", "0", "600"},
	}
	if diff := cmp.Diff(want, tunes); diff != "" || len(conflicts) != 0 {
		t.Fatalf("tunes (-want +got):\n%s\nconflicts %v", diff, conflicts)
	}
	if done := ApplyTunes(fsys, tunes); len(done) != len(tunes) {
		t.Fatalf("applied %d of %d", len(done), len(tunes))
	}
	// What the kernel shows after the writes ("off" for -1); a file of
	// the test tree keeps the tail of a longer old value, sysfs does not.
	for _, tu := range tunes {
		shown := tu.To
		if shown == "-1" {
			shown = "off"
		}
		rewrite(t, fsys, tu.Path, shown)
	}
	if tunes, _ := TimeoutTunes(fsys, mustRead(t, fsys), []TuneTarget{vol1}); len(tunes) != 0 {
		t.Errorf("aligned controllers tuned again: %+v", tunes)
	}

	// A second volume of the subsystem wanting other timeouts: the shared
	// controllers are left alone and named.
	vol2 := TuneTarget{Expectation: Expectation{VolumeID: "pv-2", NQN: "nqn.2024-01.io.example:a", Endpoints: eps, NSID: 2}, Timeouts: TimeoutsOf(&volume.NVMeTCP{CtrlLossTmo: intp(60)})}
	tunes, conflicts = TimeoutTunes(fsys, mustRead(t, fsys), []TuneTarget{vol1, vol2})
	if len(tunes) != 0 || !cmp.Equal(conflicts, []string{"nvme0", "nvme1"}) {
		t.Errorf("disagreeing volumes: tunes %+v, conflicts %v", tunes, conflicts)
	}
}

// A finite ctrl_loss_tmo shows rounded up to whole reconnect delays: 7 s
// with a 5 s delay shows as 10, and is not written again.
func TestTimeoutTunes_CtrlLossTmoRoundsToTheReconnectDelay(t *testing.T) {
	topo := nvmetest.Topology{Subsystems: []nvmetest.Subsystem{{Instance: 0, NQN: "nqn.2024-01.io.example:a",
		Namespaces:  []nvmetest.Namespace{{Head: 1, NSID: 1}},
		Controllers: []nvmetest.Controller{{Instance: 0, Traddr: "127.0.0.1", CtrlLossTmo: "10", ReconnectDelay: "5", Legs: legs("optimized", 1)}}}}}
	fsys := materialize(t, topo.Fixture())
	vol := TuneTarget{Expectation: Expectation{VolumeID: "pv", NQN: "nqn.2024-01.io.example:a", Endpoints: []volume.Endpoint{{Host: "127.0.0.1", Port: 4420}}, NSID: 1},
		Timeouts: TimeoutsOf(&volume.NVMeTCP{CtrlLossTmo: intp(7)})}
	if tunes, _ := TimeoutTunes(fsys, mustRead(t, fsys), []TuneTarget{vol}); len(tunes) != 0 {
		t.Errorf("tunes %+v", tunes)
	}
}

// rewrite sets the file at p (relative to the root of fsys) to v.
func rewrite(t *testing.T, fsys sysfs.FS, p, v string) {
	t.Helper()
	if err := os.WriteFile(fsys.Path(p), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
