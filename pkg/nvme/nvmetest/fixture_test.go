package nvmetest_test

import (
	"testing"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// TestFixture_MirrorsTheRealLayout generates the topology of the lab's
// nvme-healthy capture and checks that every entry the generator writes
// exists in the capture at the same path, of the same kind, with the same
// mode and link target, and for the values the topology fixes, the same
// content: the generated tree is a subset of what Linux 6.1 publishes.
func TestFixture_MirrorsTheRealLayout(t *testing.T) {
	real, err := sysfstest.LoadFixture("../../../testdata/fixtures/nvme-healthy.sysfs")
	if err != nil {
		t.Fatal(err)
	}
	legs := func(state string, heads ...int) map[int]string {
		m := map[int]string{}
		for _, h := range heads {
			m[h] = state
		}
		return m
	}
	ctrl := func(n int, port string, l map[int]string) nvmetest.Controller {
		return nvmetest.Controller{Instance: n, Traddr: "127.0.0.1", Trsvcid: port, SrcAddr: "127.0.0.1", CntlID: n + 1, ReconnectDelay: "2", Legs: l}
	}
	topo := nvmetest.Topology{Subsystems: []nvmetest.Subsystem{
		{
			Instance: 0, NQN: "nqn.2024-01.io.pathmend.lab:healthy-a", Model: "pathmend-lab", Serial: "955dc4bb586cbb07c4b4",
			Namespaces: []nvmetest.Namespace{
				{Head: 1, NSID: 1, UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2", Dev: "259:1"},
				{Head: 2, NSID: 2, UUID: "9c22a744-dc01-4342-82d2-c04fda5541eb", Dev: "259:3"},
				{Head: 3, NSID: 3, UUID: "8a3c9045-72ca-4db0-86db-7750e966cb7d", Dev: "259:5"},
			},
			Controllers: []nvmetest.Controller{ctrl(0, "4420", legs("optimized", 1, 2, 3)), ctrl(1, "4421", legs("non-optimized", 1, 2, 3))},
		},
		{
			Instance: 2, NQN: "nqn.2024-01.io.pathmend.lab:healthy-b", Model: "pathmend-lab",
			Namespaces:  []nvmetest.Namespace{{Head: 1, NSID: 1, UUID: "83a5c102-32fb-4c95-819e-5d3d2e124ce9", Dev: "259:10"}},
			Controllers: []nvmetest.Controller{ctrl(2, "4420", legs("optimized", 1)), ctrl(3, "4421", legs("non-optimized", 1))},
		},
	}}
	gen := topo.Fixture()
	if len(gen.Entries) < 150 {
		t.Fatalf("generated only %d entries", len(gen.Entries))
	}
	// Values that depend on the lab's host and target, not on the topology.
	hostSpecific := map[string]bool{"serial": true, "hostnqn": true}
	for _, e := range gen.Entries {
		r, ok := real.Lookup(e.Path)
		switch {
		case !ok:
			t.Errorf("%s %s: not in the capture", e.Kind, e.Path)
		case r.Kind != e.Kind || r.Mode != e.Mode || r.Target != e.Target:
			t.Errorf("%s: generated %s %o %q, captured %s %o %q", e.Path, e.Kind, e.Mode, e.Target, r.Kind, r.Mode, r.Target)
		case e.Kind == sysfstest.KindFile && r.Value != e.Value && !hostSpecific[sysfs.Base(e.Path)] && e.Path != "devices/virtual/nvme-subsystem/nvme-subsys2/serial":
			t.Errorf("%s: generated %q, captured %q", e.Path, e.Value, r.Value)
		}
	}
}
