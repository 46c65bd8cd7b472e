package iscsi

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// iscsiChangeKinds are words of iscsitest.Change's descriptions, one per
// kind of change.
var iscsiChangeKinds = []string{"nothing", "FAILED", "FREE", "LOGGED_IN", "connections", "recovery_tmo",
	"logged out", "logged in", "re-created for", "LUN state", "rescanned", "bound", "unbound", "added",
	"removed", "created", "renamed", "holders", "slave"}

// TestReader_EqualsAFreshReadAfterEveryKernelChange is the proof of the
// incremental iSCSI read: random nodes, changed step by step the way the
// kernel changes sysfs (sessions failing and logging in again,
// connections flapping, logouts and logins reusing host and disk names,
// LUNs and maps coming, going and changing, a session re-created under
// its ID), and after every step one long-lived Reader must return exactly
// what a fresh Read returns.
func TestReader_EqualsAFreshReadAfterEveryKernelChange(t *testing.T) {
	t.Parallel()
	kinds := map[string]int{}
	var incremental, fresh int
	for seed := range 12 {
		i, f := checkISCSIChanges(t, rand.New(rand.NewPCG(uint64(seed), 23)), 40, kinds)
		incremental, fresh = incremental+i, fresh+f
	}
	for _, k := range iscsiChangeKinds {
		if kinds[k] == 0 {
			t.Errorf("no %q change among the random steps: the property was not exercised", k)
		}
	}
	if incremental >= fresh {
		t.Errorf("incremental reads opened %d attribute files, fresh reads %d: nothing was kept", incremental, fresh)
	}
	t.Logf("changes: %v; attribute files read: incremental %d, fresh %d", kinds, incremental, fresh)
}

// FuzzReader runs the property above on nodes and change sequences drawn
// from the fuzzer's seed.
func FuzzReader(f *testing.F) {
	for _, s := range []uint64{0, 5, 1 << 35} {
		f.Add(s, s+9)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		checkISCSIChanges(t, rand.New(rand.NewPCG(a, b)), 12, nil)
	})
}

func checkISCSIChanges(t *testing.T, r *rand.Rand, steps int, kinds map[string]int) (incremental, fresh int) {
	t.Helper()
	tree, err := iscsitest.NewTree(t.TempDir(), iscsitest.Random(r, 1+r.IntN(4)), t0)
	if err != nil {
		t.Fatal(err)
	}
	reader := NewReader(tree.FS())
	history := []string{"initial"}
	for step := 0; ; step++ {
		before := reader.Counts().Reads
		fr := NewReader(tree.FS())
		want, werr := fr.Read(t0)
		got, gerr := reader.Read(t0)
		incremental += reader.Counts().Reads - before
		fresh += fr.Counts().Reads
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("after %s: fresh Read error %v, Reader error %v", strings.Join(history, "; "), werr, gerr)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("after %s: Reader differs from a fresh Read (-fresh +reader):\n%s", strings.Join(history, "; "), d)
		}
		if step == steps {
			return incremental, fresh
		}
		next, what := iscsitest.Change(r, tree.Topology())
		if err := tree.Apply(next); err != nil {
			t.Fatalf("apply %s: %v", what, err)
		}
		history = append(history, what)
		for _, k := range iscsiChangeKinds {
			if kinds != nil && strings.Contains(what, k) {
				kinds[k]++
			}
		}
	}
}

// A second read of an unchanged node does not read what iscsid fixes for
// a session's life (targetname, tpgt, ifacename, the class link, a
// connection's persistent portal) nor a map's UUID.
func TestReader_SecondReadReadsOnlyVolatileAttributes(t *testing.T) {
	r := NewReader(capture(t, "iscsi-healthy"))
	first, err := r.Read(t0)
	if err != nil {
		t.Fatal(err)
	}
	c1 := r.Counts()
	second, err := r.Read(t0)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(first, second); d != "" {
		t.Fatalf("second read differs (-first +second):\n%s", d)
	}
	c2 := r.Counts()
	// Per session: state, recovery_tmo, target_id, initiatorname; per
	// connection: state, address, port; per LUN: state, wwid, size; per
	// map: dm/name, size. Two sessions of one connection and two LUNs,
	// two maps.
	const volatile = 2*4 + 2*3 + 4*3 + 2*2
	if got := c2.Reads - c1.Reads; got != volatile {
		t.Errorf("second read opened %d attribute files, want %d (first read: %d)", got, volatile, c1.Reads)
	}
}

// The captures of real kernels replay through both readers with
// identical results: each is read by one long-lived Reader right after
// it replaced the previous one (every object new, session1, host0 and
// sda reused) and once more unchanged, and both reads must equal a fresh
// Read.
func TestReader_ReplaysTheLabCaptures(t *testing.T) {
	names, err := filepath.Glob(filepath.Join(fixtureDir, "*.sysfs"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no captures in %s (%v)", fixtureDir, err)
	}
	root := filepath.Join(t.TempDir(), "sys")
	fsys := sysfs.New(root)
	r := NewReader(fsys)
	for round := range 2 {
		for _, n := range names {
			f, err := sysfs.LoadFixture(n)
			if err != nil {
				t.Fatal(err)
			}
			if err := sysfs.Replace(root, f, t0); err != nil {
				t.Fatal(err)
			}
			for _, when := range []string{"after the replacement", "unchanged"} {
				want, err := Read(fsys, t0)
				if err != nil {
					t.Fatal(err)
				}
				got, err := r.Read(t0)
				if err != nil {
					t.Fatalf("round %d, %s %s: %v", round, filepath.Base(n), when, err)
				}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("round %d, %s %s (-fresh +reader):\n%s", round, filepath.Base(n), when, d)
				}
			}
		}
	}
}
