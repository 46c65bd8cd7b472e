package nvme

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

var randomLimits = nvmetest.Limits{Subsystems: 4, Controllers: 4, Namespaces: 3, SharedNQN: 0.3}

// volumesOf returns one expectation per namespace of h, listing every
// endpoint of the namespace's subsystem: what a node that staged all of
// them would hold.
func volumesOf(h *Host) []Expectation {
	var want []Expectation
	for _, s := range h.Subsystems {
		var eps []volume.Endpoint
		for _, name := range s.Controllers {
			c, _ := h.Controller(name)
			port, _ := strconv.Atoi(c.Address.Trsvcid)
			eps = append(eps, volume.Endpoint{Host: c.Address.Traddr, Port: uint16(port)})
		}
		for _, ns := range s.Namespaces {
			want = append(want, Expectation{VolumeID: string(ns.Subsystem) + "/" + strconv.Itoa(ns.HeadInstance), NQN: s.NQN, Endpoints: eps, NSID: ns.NSID})
		}
	}
	return want
}

// Creating files dominates these tests; `go test -fuzz FuzzInspect` runs
// the same checks on as many more topologies as one cares to wait for.
func TestProperty_HealthyTopologiesHaveNoDefect(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 40 {
		topo := nvmetest.Random(r, randomLimits).MakeHealthy()
		h := readTopology(t, topo)
		for _, want := range [][]Expectation{nil, volumesOf(h)} {
			if got := Inspect(h, want); len(got) != 0 {
				t.Fatalf("topology %d (%+v): Inspect = %+v", i, topo, got)
			}
		}
	}
}

func TestProperty_CoTenantsAreExactlyTheStrandedNamespaces(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	seen := map[heal.Kind]int{}
	stranding := 0
	for i := range 80 {
		topo := nvmetest.Random(r, randomLimits)
		h := readTopology(t, topo)
		// Volumes for a random subset of namespaces, some with an
		// identity nothing exports, some listing a subset of endpoints.
		want := volumesOf(h)
		for j := range want {
			if r.IntN(5) == 0 {
				want[j].NSID += 100
			}
			if r.IntN(5) == 0 && len(want[j].Endpoints) > 1 {
				want[j].Endpoints = want[j].Endpoints[1:]
			}
		}
		want = slices.DeleteFunc(want, func(Expectation) bool { return r.IntN(3) == 0 })
		got := Inspect(h, want)
		if d := cmp.Diff(got, Inspect(h, want)); d != "" {
			t.Fatalf("topology %d: Inspect is not deterministic:\n%s", i, d)
		}
		for _, d := range got {
			seen[d.Kind]++
			if len(d.CoTenants) > 0 {
				stranding++
			}
			checkDefect(t, h, d)
		}
	}
	if stranding == 0 {
		t.Error("no defect with co-tenants among the random topologies: the property was not exercised")
	}
	for _, k := range []heal.Kind{heal.NoNamespace, heal.NamespaceMissing, heal.ControllerNotContributing, heal.AmbiguousHead, heal.StaleEndpoint} {
		if seen[k] == 0 {
			t.Errorf("no %s among the random topologies: the property was not exercised", k)
		}
	}
	t.Logf("defects checked: %v, %d with co-tenants", seen, stranding)
}

// checkDefect is an independent oracle for the blast radius: every
// namespace the teardown takes the last usable path from (or the last
// path of any kind) appears in CoTenants, and nothing else does, except
// for the subjects of the defect.
func checkDefect(t *testing.T, h *Host, d heal.Defect) {
	t.Helper()
	if d.Teardown == nil {
		t.Fatalf("%s %s: nil teardown", d.Kind, d.Subject)
	}
	gone := map[ControllerName]bool{}
	var subName SubsystemName
	for _, p := range d.Teardown {
		c, ok := h.Controller(ControllerName(p.Name))
		if !ok || (subName != "" && c.Subsystem != subName) {
			t.Fatalf("%s %s: teardown %s is not a controller of one subsystem", d.Kind, d.Subject, p.Name)
		}
		subName = c.Subsystem
		gone[c.Name] = true
	}
	if len(gone) == 0 || d.Kind == heal.AmbiguousHead {
		if len(d.CoTenants) != 0 {
			t.Fatalf("%s %s: co-tenants %+v", d.Kind, d.Subject, d.CoTenants)
		}
		return
	}
	usable := func(p Path) bool {
		c, _ := h.Controller(p.Controller)
		return c.State == StateLive && (p.ANAState == ANAOptimized || p.ANAState == ANANonOptimized || p.ANAState == ANANone)
	}
	s, _ := h.Subsystem(subName)
	var want []heal.CoTenant
	for _, ns := range s.Namespaces {
		if d.Kind == heal.ControllerNotContributing && !slices.ContainsFunc(ns.Paths, func(p Path) bool { return gone[p.Controller] }) {
			continue // a subject: the controller has no leg to it
		}
		var in, outUsable, nowUsable, out int
		for _, p := range ns.Paths {
			if usable(p) {
				nowUsable++
			}
			if gone[p.Controller] {
				in++
			} else {
				out++
				if usable(p) {
					outUsable++
				}
			}
		}
		lastUsable := nowUsable > 0 && outUsable == 0
		lastPath := in > 0 && out == 0
		if in > 0 && (lastUsable || lastPath) {
			for _, dev := range ns.Devices() {
				want = append(want, heal.CoTenant{Namespace: string(s.Name) + " nsid " + strconv.Itoa(int(ns.NSID)), Device: string(dev)})
			}
		}
	}
	if diff := cmp.Diff(want, d.CoTenants); diff != "" {
		t.Fatalf("%s %s teardown %v: co-tenants (-want +got):\n%s", d.Kind, d.Subject, d.Teardown, diff)
	}
}

// FuzzInspect draws a topology from the fuzzer's seed, reads it and checks
// the properties above on whatever Inspect reports.
func FuzzInspect(f *testing.F) {
	for _, s := range []uint64{0, 1, 42, 1 << 40} {
		f.Add(s, s+1)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		topo := nvmetest.Random(r, randomLimits)
		if r.IntN(2) == 0 {
			h := readTopology(t, topo.MakeHealthy())
			if got := Inspect(h, volumesOf(h)); len(got) != 0 {
				t.Fatalf("healthy topology: Inspect = %+v", got)
			}
			return
		}
		h := readTopology(t, topo)
		for _, d := range Inspect(h, volumesOf(h)) {
			checkDefect(t, h, d)
		}
	})
}
