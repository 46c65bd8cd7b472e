package nvme

import (
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// peeker is a long-lived Reader answering PeekTarget after every kernel
// change. A told one is told (Forget) whenever a change added, removed or
// renamed an entry of the two class directories, as the kernel's add
// and remove events tell the loop; an untold one never is: its kept
// listings go stale.
type peeker struct {
	r     *Reader
	told  bool
	names []string
}

// classEntries lists class/nvme and class/nvme-subsystem of fsys.
func classEntries(t *testing.T, fsys sysfs.FS) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{classNVMe, classSubsystem} {
		es, err := os.ReadDir(fsys.Path(dir))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range es {
			out = append(out, dir+"/"+e.Name())
		}
	}
	return out
}

// checkPeeks compares PeekTarget of every NQN with that NQN's part of
// full, a fresh read in the peeker's scope. Told, it must be equal: the
// kept listings hold the directories' names (an object re-created under a
// kept name is one PeekTarget opens and finds another). Untold, what it
// reports must never be older than the kernel: every controller it
// reports is the fresh read's, equal, and every subsystem it reports is
// the fresh read's with the same member controllers and heads — a stale
// listing may hide a new object, never show a gone one or an old state.
func checkPeeks(t *testing.T, pk *peeker, fsys sysfs.FS, full *Host, history string, topo nvmetest.Topology) {
	t.Helper()
	names := classEntries(t, fsys)
	if pk.told && !slices.Equal(names, pk.names) {
		pk.r.Forget()
	}
	pk.names = names
	nqns := map[string]bool{"nqn.2014-08.io.pathmend.test:none": true}
	for _, s := range full.Subsystems {
		nqns[s.NQN] = true
	}
	for _, c := range full.Controllers {
		nqns[c.SubsysNQN] = true
	}
	for _, nqn := range slices.Sorted(maps.Keys(nqns)) {
		got, _, err := pk.r.PeekTarget(nqn)
		if err != nil {
			t.Fatalf("after %s: PeekTarget(%s): %v", history, nqn, err)
		}
		forgetRememberedAddresses(t, got, topo)
		want := TargetOf(full, nqn)
		if pk.told {
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("after %s: PeekTarget(%s), told of every class change, differs from that NQN's part of a fresh Read (-fresh +peek):\n%s", history, nqn, d)
			}
			continue
		}
		for _, c := range got.Controllers {
			w, ok := want.Controller(c.Name)
			if !ok {
				t.Fatalf("after %s: PeekTarget(%s) from stale listings reports %s, which the kernel no longer has for it", history, nqn, c.Name)
			}
			if d := cmp.Diff(*w, c); d != "" {
				t.Fatalf("after %s: PeekTarget(%s) from stale listings reports %s otherwise than the kernel has it (-fresh +peek):\n%s", history, nqn, c.Name, d)
			}
		}
		for _, s := range got.Subsystems {
			i := slices.IndexFunc(want.Subsystems, func(w Subsystem) bool { return w.Name == s.Name })
			if i < 0 {
				t.Fatalf("after %s: PeekTarget(%s) from stale listings reports %s, which the kernel no longer has for it", history, nqn, s.Name)
			}
			w := want.Subsystems[i]
			heads := func(s Subsystem) (out []DeviceName) {
				for _, ns := range s.Namespaces {
					out = append(out, ns.Head)
				}
				return out
			}
			if !slices.Equal(w.Controllers, s.Controllers) || !slices.Equal(heads(w), heads(s)) {
				t.Fatalf("after %s: PeekTarget(%s) from stale listings reports %s with members %v and heads %v; the kernel has %v and %v", history, nqn, s.Name, s.Controllers, heads(s), w.Controllers, heads(w))
			}
		}
	}
}

// On a steady host a PeekTarget from kept listings reads what ReadTarget
// reads of the subsystem's own objects, and lists neither class
// directory; after Forget it lists them again, once.
func TestReader_PeekTargetListsNoClassDirectory(t *testing.T) {
	fsys := materialize(t, nvmetest.Healthy(100, 3, 1).Fixture())
	r := NewReader(fsys, ScopePaths)
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	const nqn = "nqn.2024-01.io.pathmend.test:sub-42"
	fresh, err := r.ReadTarget(nqn)
	if err != nil {
		t.Fatal(err)
	}
	cost := func(f func()) sysfs.Counts {
		before := r.Counts()
		f()
		got := r.Counts()
		got.Reads, got.Lists, got.Stats = got.Reads-before.Reads, got.Lists-before.Lists, got.Stats-before.Stats
		return got
	}
	var got *Host
	var kept bool
	c := cost(func() { got, kept, err = r.PeekTarget(nqn) })
	if err != nil || !kept {
		t.Fatalf("PeekTarget: kept %v, %v", kept, err)
	}
	if c.Reads != 6 || c.Lists != 4 || c.Stats != 1 {
		t.Errorf("PeekTarget of one subsystem: %d attribute reads, %d listings, %d stats; want 6, 4 (its subsystem's and controllers' directories), 1", c.Reads, c.Lists, c.Stats)
	}
	if d := cmp.Diff(fresh, got); d != "" {
		t.Errorf("PeekTarget differs from ReadTarget (-read +peek):\n%s", d)
	}
	r.Forget()
	c = cost(func() { got, kept, err = r.PeekTarget(nqn) })
	if err != nil || kept || c.Lists != 6 {
		t.Errorf("PeekTarget after Forget: kept %v, %d listings (want 6), %v", kept, c.Lists, err)
	}
	if c = cost(func() { _, kept, _ = r.PeekTarget(nqn) }); !kept || c.Lists != 4 {
		t.Errorf("the PeekTarget after: kept %v, %d listings; want the listings kept again", kept, c.Lists)
	}
}

// A stale kept listing never decides an absence: when a subsystem's
// controllers are all deleted and it comes back as another instance the
// kept listings do not have, PeekTarget finds the instance it knew gone
// and reads with listings again — the new instance and its controllers
// are there.
func TestReader_PeekTargetReadsAgainWhenItsSubsystemMoved(t *testing.T) {
	topo := nvmetest.Healthy(3, 2, 1)
	tree, err := nvmetest.NewTree(t.TempDir(), topo, testNow)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(tree.FS(), ScopePaths)
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	nqn := topo.Subsystems[1].NQN
	next := tree.Topology()
	s := &next.Subsystems[1]
	s.Instance = 9
	for i := range s.Controllers {
		s.Controllers[i].Instance = 10 + i
	}
	if err := tree.Apply(next); err != nil {
		t.Fatal(err)
	}
	h, kept, err := r.PeekTarget(nqn)
	if err != nil {
		t.Fatal(err)
	}
	if kept {
		t.Errorf("PeekTarget answered from the kept listings though the instance it knew is gone")
	}
	fresh, err := Read(tree.FS())
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(pathScope(TargetOf(fresh, nqn)), h); d != "" {
		t.Errorf("PeekTarget after its subsystem moved (-fresh +peek):\n%s", d)
	}
}
