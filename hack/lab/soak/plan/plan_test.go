package plan

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func labTopology() Topology {
	return Topology{
		Groups: []Group{
			{ID: "nvme-a", Window: 60 * time.Second, Paths: []Path{{ID: "a-opt"}, {ID: "a-nonopt"}}},
			{ID: "nvme-b", Window: 15 * time.Second, CtrlLoss: 30 * time.Second, Paths: []Path{{ID: "b-direct"}, {ID: "b-alias", Alias: true}}},
			{ID: "iscsi", Window: 45 * time.Second, Paths: []Path{{ID: "i-direct", ISCSI: true}, {ID: "i-proxy", ISCSI: true, Proxy: true}}},
			{ID: "nvme-c", Window: 3 * time.Second, FSQueue: 8 * time.Second, Paths: []Path{{ID: "c-opt"}, {ID: "c-nonopt"}}},
		},
		Volumes: []Volume{
			{ID: "vol-a1", Group: "nvme-a"},
			{ID: "vol-a2", Group: "nvme-a", Block: true},
			{ID: "vol-b", Group: "nvme-b"},
			{ID: "vol-i", Group: "iscsi"},
			{ID: "vol-c", Group: "nvme-c"},
		},
	}
}

// The plan is a function of its seed: a run replays.
func TestMake_SameSeedSamePlan(t *testing.T) {
	a := Make(42, 5*time.Minute, labTopology(), DefaultOptions)
	b := Make(42, 5*time.Minute, labTopology(), DefaultOptions)
	if d := cmp.Diff(a, b); d != "" {
		t.Fatalf("two plans of seed 42 differ:\n%s", d)
	}
	c := Make(43, 5*time.Minute, labTopology(), DefaultOptions)
	if cmp.Equal(a.Faults, c.Faults) {
		t.Fatal("seeds 42 and 43 gave the same plan")
	}
}

// Over many seeds: faults start within the run, in order, numbered;
// each lands only where its kind may; no path, volume or pathmend is held
// by two faults at once; every group's all-paths-down time stays within
// its window, except the filesystem-error fault's, which holds every path
// of its group down past the group's queueing window with no other fault
// on the group meanwhile; and every kind of the catalogue is drawn.
func TestMake_KeepsItsRulesOverManySeeds(t *testing.T) {
	topo := labTopology()
	paths := map[string]Path{}
	groupOf := map[string]Group{}
	for _, g := range topo.Groups {
		for _, p := range g.Paths {
			paths[p.ID], groupOf[p.ID] = p, g
		}
	}
	seen := map[Kind]int{}
	for seed := range uint64(200) {
		p := Make(seed, 10*time.Minute, topo, DefaultOptions)
		held := map[string][]interval{}
		down := map[string][]interval{}
		fsErr := map[string][]interval{} // group → the filesystem-error faults' spans
		var kills []time.Duration
		for i, f := range p.Faults {
			seen[f.Kind]++
			if f.ID != i+1 || f.At < 0 || f.At >= p.Duration || (i > 0 && f.At < p.Faults[i-1].At) {
				t.Fatalf("seed %d: fault %d out of order or outside the run: %s", seed, i, f)
			}
			sp := specs[f.Kind]
			switch sp.target {
			case "path":
				if !sp.eligible(groupOf[f.Path], paths[f.Path], Volume{}) {
					t.Fatalf("seed %d: %s landed on a path it may not hit", seed, f)
				}
			case "volume":
				if f.Volume == "" {
					t.Fatalf("seed %d: %s has no volume", seed, f)
				}
			case "group":
				g := Group{}
				for _, x := range topo.Groups {
					if x.ID == f.Group {
						g = x
					}
				}
				if g.FSQueue == 0 || f.Hold <= g.FSQueue {
					t.Fatalf("seed %d: %s is not held past the queueing window of %q (%s)", seed, f, f.Group, g.FSQueue)
				}
				span := interval{f.At, f.At + f.Hold + sp.tail}
				fsErr[g.ID] = append(fsErr[g.ID], span)
				for _, path := range g.Paths {
					for _, iv := range append(held[path.ID], down[path.ID]...) {
						if iv.overlaps(span) {
							t.Fatalf("seed %d: %s overlaps another fault on %s", seed, f, path.ID)
						}
					}
					held[path.ID] = append(held[path.ID], span)
					down[path.ID] = append(down[path.ID], span)
				}
				continue
			}
			if f.Kind == NVMeDropLong && f.Hold <= groupOf[f.Path].CtrlLoss {
				t.Errorf("seed %d: %s is not held past ctrl_loss_tmo %s", seed, f, groupOf[f.Path].CtrlLoss)
			}
			span := interval{f.At, f.At + f.Hold + sp.tail}
			res := f.Path + f.Volume
			for _, iv := range held[res] {
				if res != "" && iv.overlaps(span) {
					t.Fatalf("seed %d: %s overlaps another fault on %s", seed, f, res)
				}
			}
			held[res] = append(held[res], span)
			if sp.down {
				down[f.Path] = append(down[f.Path], span)
			}
			if f.Kind == Kill || f.Kind == KillInHeal || f.Kind == RestageKill {
				for _, k := range kills {
					if d := f.At - k; d < DefaultOptions.KillGap && d > -DefaultOptions.KillGap {
						t.Fatalf("seed %d: kills %s and %s too close", seed, k, f.At)
					}
				}
				kills = append(kills, f.At)
			}
		}
		for _, g := range topo.Groups {
			var acc []interval
			for i, path := range g.Paths {
				u := union(down[path.ID])
				if i == 0 {
					acc = u
				} else {
					acc = intersect(acc, u)
				}
			}
			for _, iv := range acc {
				inFSErr := false
				for _, fe := range fsErr[g.ID] {
					inFSErr = inFSErr || (fe.from <= iv.from && iv.to <= fe.to)
				}
				if iv.to-iv.from > g.Window && !inFSErr {
					t.Fatalf("seed %d: every path of %s down for %s, window %s", seed, g.ID, iv.to-iv.from, g.Window)
				}
			}
		}
	}
	for _, k := range Kinds {
		if seen[k] == 0 {
			t.Errorf("kind %s never planned over 200 seeds", k)
		}
	}
}

func TestMake_OnlyRestrictsTheCatalogue(t *testing.T) {
	p := Make(7, 10*time.Minute, labTopology(), Options{MeanGap: 5 * time.Second, MinGap: time.Second, KillGap: 20 * time.Second, Only: []Kind{ControllerDelete}})
	if len(p.Faults) == 0 {
		t.Fatal("no fault planned")
	}
	for _, f := range p.Faults {
		if f.Kind != ControllerDelete {
			t.Fatalf("planned %s", f)
		}
	}
}

// A kind that takes a whole group is drawn on a stream of its own, on a
// group no other kind touches: a seed's schedule of every other kind is
// the same with it as without it and its group (CI's fixed seed keeps its
// history when the catalogue grows that way).
func TestMake_AGroupKindLeavesTheOthersScheduleAsItWas(t *testing.T) {
	with := labTopology()
	without := labTopology()
	without.Groups = without.Groups[:3]
	without.Volumes = without.Volumes[:4]
	var others []Kind
	for _, k := range Kinds {
		if k != FilesystemError {
			others = append(others, k)
		}
	}
	drawn := 0
	for seed := range uint64(100) {
		a := Make(seed, 10*time.Minute, with, DefaultOptions)
		o := DefaultOptions
		o.Only = others
		b := Make(seed, 10*time.Minute, without, o)
		var rest []Fault
		for _, f := range a.Faults {
			if f.Kind == FilesystemError {
				drawn++
				continue
			}
			if f.Path == "c-opt" || f.Path == "c-nonopt" || f.Volume == "vol-c" {
				t.Fatalf("seed %d: %s on the filesystem-error group", seed, f)
			}
			f.ID = 0
			rest = append(rest, f)
		}
		for i := range b.Faults {
			b.Faults[i].ID = 0
		}
		if d := cmp.Diff(b.Faults, rest); d != "" {
			t.Fatalf("seed %d: the other kinds' schedule moved (-without +with):\n%s", seed, d)
		}
	}
	if drawn == 0 {
		t.Fatal("no filesystem-error drawn over 100 seeds")
	}
}

func TestIntervals(t *testing.T) {
	s := time.Second
	u := union([]interval{{5 * s, 8 * s}, {0, 2 * s}, {1 * s, 3 * s}, {8 * s, 9 * s}})
	if d := cmp.Diff([]interval{{0, 3 * s}, {5 * s, 9 * s}}, u, cmp.AllowUnexported(interval{})); d != "" {
		t.Errorf("union (-want +got):\n%s", d)
	}
	x := intersect(u, []interval{{2 * s, 6 * s}, {7 * s, 20 * s}})
	if d := cmp.Diff([]interval{{2 * s, 3 * s}, {5 * s, 6 * s}, {7 * s, 9 * s}}, x, cmp.AllowUnexported(interval{})); d != "" {
		t.Errorf("intersect (-want +got):\n%s", d)
	}
}
