package nvme

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// twoPathTopology is one subsystem (instance 2) with namespaces 1 and 2
// reached through controllers 0 (optimized) and 1 (non-optimized).
func twoPathTopology() nvmetest.Topology {
	return nvmetest.Topology{Subsystems: []nvmetest.Subsystem{{
		Instance: 2,
		NQN:      "nqn.2024-01.io.pathmend.test:a",
		Namespaces: []nvmetest.Namespace{
			{Head: 1, NSID: 1, UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2", Dev: "259:1"},
			{Head: 2, NSID: 2, NGUID: "0a0b0c0d-0000-0000-0000-000000000002", Sectors: 2048, Dev: "259:3"},
		},
		Controllers: []nvmetest.Controller{
			{Instance: 0, Trsvcid: "4420", Age: time.Minute, Legs: legs("optimized", 1, 2)},
			{Instance: 1, Trsvcid: "4421", Age: 2 * time.Minute, Legs: legs("non-optimized", 1, 2), FastIOFailTmo: "5", CtrlLossTmo: "off"},
		},
	}}}
}

func wantController(n int, trsvcid string, age time.Duration) Controller {
	return Controller{
		Name:           ControllerName("nvme" + itoa(n)),
		Subsystem:      "nvme-subsys2",
		State:          StateLive,
		Transport:      "tcp",
		Address:        Address{Traddr: "192.0.2.1", Trsvcid: trsvcid, SrcAddr: "192.0.2.100"},
		RawAddress:     "traddr=192.0.2.1,trsvcid=" + trsvcid + ",src_addr=192.0.2.100",
		CntlID:         uint16(n + 1),
		SubsysNQN:      "nqn.2024-01.io.pathmend.test:a",
		HostNQN:        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001",
		CtrlLossTmo:    Timeout{Seconds: 600},
		ReconnectDelay: Timeout{Seconds: 10},
		FastIOFailTmo:  Timeout{Off: true},
		KATO:           5,
		CreatedAt:      testNow.Add(-age),
	}
}

func TestRead_NativeMultipath(t *testing.T) {
	h := readTopology(t, twoPathTopology())
	c1 := wantController(1, "4421", 2*time.Minute)
	c1.CtrlLossTmo, c1.FastIOFailTmo = Timeout{Off: true}, Timeout{Seconds: 5}
	want := &Host{
		Subsystems: []Subsystem{{
			Name: "nvme-subsys2", NQN: "nqn.2024-01.io.pathmend.test:a", Model: "pathmend-test",
			Serial: "00000000000000000003", IOPolicy: "numa", Type: "nvm",
			Controllers: []ControllerName{"nvme0", "nvme1"},
			Namespaces: []Namespace{
				{
					Subsystem: "nvme-subsys2", HeadInstance: 1, Head: "nvme2n1", NSID: 1,
					UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2", WWID: "uuid.f68ad72e-c4c4-483b-8741-5e427c6750a2", Sectors: 131072,
					Dev: volume.DeviceNumber{Major: 259, Minor: 1},
					Paths: []Path{
						{Controller: "nvme0", Device: "nvme2c0n1", ANAState: ANAOptimized, ANAGroup: 1},
						{Controller: "nvme1", Device: "nvme2c1n1", ANAState: ANANonOptimized, ANAGroup: 1},
					},
				},
				{
					Subsystem: "nvme-subsys2", HeadInstance: 2, Head: "nvme2n2", NSID: 2,
					NGUID: "0a0b0c0d-0000-0000-0000-000000000002", UUID: "0a0b0c0d-0000-0000-0000-000000000002",
					WWID: "eui.0a0b0c0d000000000000000000000002", Sectors: 2048,
					Dev: volume.DeviceNumber{Major: 259, Minor: 3},
					Paths: []Path{
						{Controller: "nvme0", Device: "nvme2c0n2", ANAState: ANAOptimized, ANAGroup: 1},
						{Controller: "nvme1", Device: "nvme2c1n2", ANAState: ANANonOptimized, ANAGroup: 1},
					},
				},
			},
		}},
		Controllers: []Controller{wantController(0, "4420", time.Minute), c1},
	}
	if d := cmp.Diff(want, h); d != "" {
		t.Errorf("Read (-want +got):\n%s", d)
	}
	if c, ok := h.Controller("nvme1"); !ok || c.Name != "nvme1" {
		t.Errorf("Controller(nvme1) = %v, %t", c, ok)
	}
	if _, ok := h.Controller("nvme7"); ok {
		t.Error("Controller(nvme7) found")
	}
	if s, ok := h.Subsystem("nvme-subsys2"); !ok || len(s.Namespaces) != 2 {
		t.Errorf("Subsystem(nvme-subsys2) = %v, %t", s, ok)
	}
}

func TestRead_MultipathOff(t *testing.T) {
	topo := twoPathTopology()
	topo.NoMultipath = true
	h := readTopology(t, topo)
	s := h.Subsystems[0]
	got := make(map[int][]DeviceName)
	for _, ns := range s.Namespaces {
		if ns.Head != "" {
			t.Errorf("namespace %d has head %q with multipath off", ns.NSID, ns.Head)
		}
		got[int(ns.NSID)] = ns.Devices()
	}
	want := map[int][]DeviceName{1: {"nvme0n1", "nvme1n1"}, 2: {"nvme0n2", "nvme1n2"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("devices per nsid (-want +got):\n%s", d)
	}
	if p := s.Namespaces[0].Paths[1]; p != (Path{Controller: "nvme1", Device: "nvme1n1", ANAState: ANANonOptimized, ANAGroup: 1}) {
		t.Errorf("path = %+v", p)
	}
	if d := Inspect(h, nil); len(d) != 0 {
		t.Errorf("Inspect of a healthy multipath-off host: %+v", d)
	}
}

func TestRead_NoModulesLoaded(t *testing.T) {
	h := mustRead(t, sysfs.New(t.TempDir()))
	if d := cmp.Diff(&Host{Subsystems: []Subsystem{}, Controllers: []Controller{}}, h); d != "" {
		t.Errorf("Read of an empty tree (-want +got):\n%s", d)
	}
}

func TestRead_MissingRequiredAttributeNamesItsPath(t *testing.T) {
	f := twoPathTopology().Fixture()
	for _, p := range []string{
		"class/nvme/nvme1/state", "class/nvme/nvme1/transport", "class/nvme/nvme1/cntlid",
		"class/nvme/nvme1/subsysnqn", "class/nvme/nvme1/kato", "class/nvme/nvme1/address",
		"class/nvme/nvme1/hostnqn", "class/nvme/nvme1/ctrl_loss_tmo", "class/nvme/nvme1/reconnect_delay",
		"class/nvme/nvme1/fast_io_fail_tmo",
		"class/nvme-subsystem/nvme-subsys2/subsysnqn", "class/nvme-subsystem/nvme-subsys2/model",
		"class/nvme-subsystem/nvme-subsys2/serial",
		"class/nvme-subsystem/nvme-subsys2/nvme2n1/nsid", "class/nvme-subsystem/nvme-subsys2/nvme2n1/wwid",
		"class/nvme-subsystem/nvme-subsys2/nvme2n1/size", "class/nvme/nvme1/nvme2c1n2/ana_grpid",
	} {
		dev := strings.Replace(p, "class/nvme/nvme1", ctl(1), 1)
		dev = strings.Replace(dev, "class/nvme-subsystem/nvme-subsys2", subsysDev(2), 1)
		_, err := Read(materialize(t, without(f, dev)))
		if err == nil || !strings.Contains(err.Error(), "read "+p+":") {
			t.Errorf("without %s: Read error = %v, want one naming %s", dev, err, p)
		}
	}
}

func TestRead_MalformedAttributeIsAnError(t *testing.T) {
	f := twoPathTopology().Fixture()
	for path, value := range map[string]string{
		ctl(0) + "/cntlid":              "65536",
		ctl(0) + "/kato":                "five",
		ctl(0) + "/ctrl_loss_tmo":       "never",
		ctl(0) + "/address":             "traddr=1,traddr=2",
		ctl(0) + "/nvme2c0n1/ana_grpid": "-1",
		subsysDev(2) + "/nvme2n1/nsid":  "0x1",
		subsysDev(2) + "/nvme2n2/size":  "-5",
	} {
		if _, err := Read(materialize(t, withValue(f, path, value))); err == nil || !strings.Contains(err.Error(), "parse ") {
			t.Errorf("%s = %q: Read error = %v, want a parse error", path, value, err)
		}
	}
}

func TestRead_ObjectsVanishingMidReadAreSkipped(t *testing.T) {
	f := twoPathTopology().Fixture()
	// A controller deleted after class/nvme was listed: its class link
	// still names it, its directory is gone.
	gone := without(f, ctl(1))
	h := mustRead(t, materialize(t, gone))
	wantSkip := []Skip{{Path: "class/nvme/nvme1", Subsystem: "nvme-subsys2", Reason: "vanished during the read"}}
	if d := cmp.Diff(wantSkip, h.Skipped); d != "" {
		t.Errorf("Skipped (-want +got):\n%s", d)
	}
	if len(h.Controllers) != 1 || h.Controllers[0].Name != "nvme0" {
		t.Errorf("controllers = %+v, want nvme0 only", h.Controllers)
	}
	// Without the skip nvme0 alone would look fine, but nvme1 left
	// namespaces with one leg: nothing is decided about the subsystem.
	if d := Inspect(h, nil); len(d) != 0 {
		t.Errorf("Inspect of an unsettled subsystem: %+v", d)
	}

	// A subsystem removed after class/nvme-subsystem was listed: its
	// controllers, listed by no subsystem now, are skipped too.
	h = mustRead(t, materialize(t, without(f, subsysDev(2))))
	wantSkip = []Skip{
		{Path: "class/nvme-subsystem/nvme-subsys2", Subsystem: "nvme-subsys2", Reason: "vanished during the read"},
		{Path: "class/nvme/nvme0", Reason: "controller no subsystem lists"},
		{Path: "class/nvme/nvme1", Reason: "controller no subsystem lists"},
	}
	if d := cmp.Diff(wantSkip, h.Skipped); d != "" || len(h.Subsystems) != 0 {
		t.Errorf("subsystems %+v; Skipped (-want +got):\n%s", h.Subsystems, d)
	}

	// A head removed between listing the subsystem and reading it (a
	// dangling entry), and its legs left behind.
	head := subsysDev(2) + "/nvme2n2"
	dangling := without(f, head)
	dangling.Entries = append(dangling.Entries, sysfstest.Entry{Kind: sysfstest.KindLink, Path: head, Target: "gone"})
	h = mustRead(t, materialize(t, dangling))
	wantSkip = []Skip{
		{Path: "class/nvme-subsystem/nvme-subsys2/nvme2n2", Subsystem: "nvme-subsys2", Reason: "vanished during the read"},
		{Path: "class/nvme/nvme0/nvme2c0n2", Subsystem: "nvme-subsys2", Reason: "leg without namespace head nvme2n2"},
		{Path: "class/nvme/nvme1/nvme2c1n2", Subsystem: "nvme-subsys2", Reason: "leg without namespace head nvme2n2"},
	}
	if d := cmp.Diff(wantSkip, h.Skipped); d != "" {
		t.Errorf("Skipped (-want +got):\n%s", d)
	}
	if d := Inspect(h, nil); len(d) != 0 {
		t.Errorf("Inspect of an unsettled subsystem: %+v", d)
	}
}

// A disk being deleted (del_gendisk) loses its block/<disk> link, then its
// attributes, then its directory: a read in that window is a race too.
func TestRead_DisksBeingDeletedAreSkipped(t *testing.T) {
	f := twoPathTopology().Fixture()
	head := subsysDev(2) + "/nvme2n2"
	leg := ctl(1) + "/nvme2c1n1"
	for _, tc := range []struct {
		name string
		gone []string
		skip []string
	}{
		{"head without attributes and block link", []string{"block/nvme2n2", head + "/nsid", head + "/wwid"},
			[]string{"class/nvme-subsystem/nvme-subsys2/nvme2n2", "class/nvme/nvme0/nvme2c0n2", "class/nvme/nvme1/nvme2c1n2"}},
		{"head losing its attributes after nsid was read", []string{"block/nvme2n2", head + "/size"},
			[]string{"class/nvme-subsystem/nvme-subsys2/nvme2n2", "class/nvme/nvme0/nvme2c0n2", "class/nvme/nvme1/nvme2c1n2"}},
		{"leg without its attribute group", []string{leg + "/nsid", leg + "/ana_state", leg + "/ana_grpid"},
			[]string{"class/nvme/nvme1/nvme2c1n1"}},
		{"leg losing ana_grpid with its group", []string{leg + "/nsid", leg + "/ana_grpid"},
			[]string{"class/nvme/nvme1/nvme2c1n1"}},
	} {
		h := mustRead(t, materialize(t, without(f, tc.gone...)))
		var got []string
		for _, s := range h.Skipped {
			got = append(got, s.Path)
			if s.Subsystem != "nvme-subsys2" {
				t.Errorf("%s: skip %+v does not name the subsystem", tc.name, s)
			}
		}
		if d := cmp.Diff(tc.skip, got); d != "" {
			t.Errorf("%s: skipped (-want +got):\n%s", tc.name, d)
		}
	}
	// With the witness still there, a missing attribute is an error.
	if _, err := Read(materialize(t, without(f, leg+"/ana_state"))); err != nil {
		t.Errorf("a leg without ANA attributes: %v", err)
	}
	if _, err := Read(materialize(t, without(f, head+"/size"))); err == nil {
		t.Error("a head without size but with its block link read without error")
	}
}

func TestRead_LegsWithoutANAAndNonFabricsControllers(t *testing.T) {
	topo := twoPathTopology()
	topo.Subsystems[0].Controllers[1].Legs = legs(nvmetest.NoANA, 1, 2)
	f := topo.Fixture()
	// A local PCIe drive: no fabrics attributes, a PCI slot as address.
	pcie := nvmetest.Topology{Subsystems: []nvmetest.Subsystem{{
		Instance: 0, NQN: "nqn.2014.08.org.nvmexpress:8086-local",
		Controllers: []nvmetest.Controller{{Instance: 5}},
	}}}.Fixture()
	pcie = without(pcie, ctl(5)+"/hostnqn", ctl(5)+"/ctrl_loss_tmo", ctl(5)+"/reconnect_delay", ctl(5)+"/fast_io_fail_tmo")
	pcie = withValue(withValue(pcie, ctl(5)+"/transport", "pcie"), ctl(5)+"/address", "0000:01:00.0")
	for _, e := range pcie.Entries {
		if _, dup := f.Lookup(e.Path); !dup {
			f.Entries = append(f.Entries, e)
		}
	}
	h := mustRead(t, materialize(t, f))
	if p := h.Subsystems[1].Namespaces[0].Paths[1]; p.ANAState != ANANone || p.ANAGroup != 0 {
		t.Errorf("leg without ANA attributes = %+v", p)
	}
	c, _ := h.Controller("nvme5")
	if c.RawAddress != "0000:01:00.0" || c.Address != (Address{}) || c.HostNQN != "" || c.Fabrics() {
		t.Errorf("PCIe controller = %+v", c)
	}
	if d := Inspect(h, nil); len(d) != 0 {
		t.Errorf("Inspect: %+v", d)
	}
}
