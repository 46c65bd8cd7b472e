package nvme

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/internal/readertest"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// TestReader_EqualsAFreshReadAfterEveryKernelChange is the proof of the
// incremental read: random topologies, each changed step by step the way
// the kernel changes sysfs (nvmetest.Change: ANA flips, controllers dying
// and re-appearing under the same name with other attributes,
// namespaces added, removed and re-created, reconnects, timeouts,
// subsystems re-created, …), and after every step one long-lived Reader
// must return exactly what a fresh Read returns.
func TestReader_EqualsAFreshReadAfterEveryKernelChange(t *testing.T) {
	t.Parallel()
	kinds := readertest.Kinds("nothing", "ANA", "state", "reconnected", "timeouts", "iopolicy", "resized",
		"deleted", "re-created in", "connected to", "added as head", "removed", "re-created for nsid",
		"re-created for nqn", "removed with its controllers", "added with")
	var incremental, fresh int
	for seed := range 10 {
		i, f := checkChanges(t, rand.New(rand.NewPCG(uint64(seed), 19)), 32, kinds)
		incremental, fresh = incremental+i, fresh+f
	}
	readertest.Exercised(t, kinds)
	// The reader must actually have remembered something.
	if incremental >= fresh {
		t.Errorf("incremental reads opened %d attribute files, fresh reads %d: nothing was kept", incremental, fresh)
	}
	t.Logf("changes: %v; attribute files read: incremental %d, fresh %d", kinds, incremental, fresh)
}

// FuzzReader runs the property above on topologies and change sequences
// drawn from the fuzzer's seed.
func FuzzReader(f *testing.F) {
	for _, s := range []uint64{0, 7, 1 << 33} {
		f.Add(s, s+3)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		checkChanges(t, rand.New(rand.NewPCG(a, b)), 12, nil)
	})
}

// checkChanges writes a random topology, applies steps random kernel
// changes and compares a long-lived Reader with a fresh Read after each,
// and a long-lived ScopePaths Reader with the fresh Read's paths scope.
// It returns the attribute files the long-lived and the fresh reads
// opened.
func checkChanges(t *testing.T, r *rand.Rand, steps int, kinds map[string]int) (incremental, fresh int) {
	t.Helper()
	topo := nvmetest.Random(r, randomLimits)
	if r.IntN(2) == 0 {
		topo = topo.MakeHealthy()
	}
	tree, err := nvmetest.NewTree(t.TempDir(), topo, testNow)
	if err != nil {
		t.Fatal(err)
	}
	reader, paths := NewReader(tree.FS(), ScopeAll), NewReader(tree.FS(), ScopePaths)
	targets, allTargets := NewReader(tree.FS(), ScopePaths), NewReader(tree.FS(), ScopeAll)
	told, untold := &peeker{r: NewReader(tree.FS(), ScopePaths), told: true}, &peeker{r: NewReader(tree.FS(), ScopePaths)}
	remembering := func() (*Host, error) {
		before := reader.Counts().Reads
		h, err := reader.Read()
		incremental += reader.Counts().Reads - before
		if err == nil {
			forgetRememberedAddresses(t, h, tree.Topology())
		}
		return h, err
	}
	full := func() (*Host, error) {
		fr := NewReader(tree.FS(), ScopeAll)
		h, err := fr.Read()
		fresh += fr.Counts().Reads
		return h, err
	}
	change := func() string {
		next, what := nvmetest.Change(r, tree.Topology())
		if err := tree.Apply(next); err != nil {
			t.Fatalf("apply %s: %v", what, err)
		}
		return what
	}
	readertest.Changes(t, steps, remembering, full, change, func(history string, want *Host) {
		checkPathScope(t, paths, want, history, tree.Topology())
		checkTargets(t, r, targets, pathScope(want), history, tree.Topology())
		checkTargets(t, r, allTargets, want, history, tree.Topology())
		checkPeeks(t, told, tree.FS(), pathScope(want), history, tree.Topology())
		checkPeeks(t, untold, tree.FS(), pathScope(want), history, tree.Topology())
	}, kinds)
	return incremental, fresh
}

// checkPathScope compares a long-lived ScopePaths Reader with full, a
// fresh full read of the same tree: its Host must be full with the
// fields the scope leaves out zeroed, and every decision taken on it
// (Inspect, ReportPaths, ControllersTo for every endpoint of every
// namespace's volume) must be the one taken on full.
func checkPathScope(t *testing.T, paths *Reader, full *Host, history string, topo nvmetest.Topology) {
	t.Helper()
	got, err := paths.Read()
	if err != nil {
		t.Fatalf("after %s: ScopePaths Reader: %v", history, err)
	}
	forgetRememberedAddresses(t, got, topo)
	if d := cmp.Diff(pathScope(full), got); d != "" {
		t.Fatalf("after %s: ScopePaths Reader differs from the projected fresh Read (-fresh +reader):\n%s", history, d)
	}
	exps := volumesOf(full)
	if d := cmp.Diff(Inspect(full, exps), Inspect(got, exps)); d != "" {
		t.Fatalf("after %s: Inspect decides otherwise on the ScopePaths Host (-full +paths):\n%s", history, d)
	}
	for _, e := range exps {
		if d := cmp.Diff(ReportPaths(full, e), ReportPaths(got, e)); d != "" {
			t.Fatalf("after %s: ReportPaths(%s) differs on the ScopePaths Host (-full +paths):\n%s", history, e.VolumeID, d)
		}
		for _, ep := range e.Endpoints {
			names := func(cs []*Controller) (out []ControllerName) {
				for _, c := range cs {
					out = append(out, c.Name)
				}
				return out
			}
			if d := cmp.Diff(names(ControllersTo(full, e.NQN, ep)), names(ControllersTo(got, e.NQN, ep))); d != "" {
				t.Fatalf("after %s: ControllersTo(%s) differs on the ScopePaths Host:\n%s", history, ep, d)
			}
		}
	}
}

// checkTargets compares what a long-lived Reader reads of each subsystem
// NQN alone (ReadTarget; as the loop's and the attacher's Readers do,
// which also read the whole host now and then) with that NQN's part of
// full, a fresh full read in the Reader's scope: the Hosts must be equal
// (TargetOf), and so must the path report of every volume of the NQN.
func checkTargets(t *testing.T, r *rand.Rand, targets *Reader, full *Host, history string, topo nvmetest.Topology) {
	t.Helper()
	if r.IntN(3) == 0 {
		if _, err := targets.Read(); err != nil {
			t.Fatalf("after %s: full read of the targets' Reader: %v", history, err)
		}
	}
	nqns := map[string]bool{"nqn.2014-08.io.pathmend.test:none": true}
	for _, s := range full.Subsystems {
		nqns[s.NQN] = true
	}
	for _, c := range full.Controllers {
		nqns[c.SubsysNQN] = true
	}
	exps := volumesOf(full)
	for nqn := range nqns {
		got, err := targets.ReadTarget(nqn)
		if err != nil {
			t.Fatalf("after %s: ReadTarget(%s): %v", history, nqn, err)
		}
		forgetRememberedAddresses(t, got, topo)
		if d := cmp.Diff(TargetOf(full, nqn), got); d != "" {
			t.Fatalf("after %s: ReadTarget(%s) differs from that NQN's part of a fresh Read (-fresh +target):\n%s", history, nqn, d)
		}
		for _, e := range exps {
			if e.NQN != nqn {
				continue
			}
			if d := cmp.Diff(ReportPaths(full, e), ReportPaths(got, e)); d != "" {
				t.Fatalf("after %s: ReportPaths(%s) differs on ReadTarget's Host (-full +target):\n%s", history, e.VolumeID, d)
			}
		}
	}
}

// pathScope is h as a ScopePaths read sees it: a copy with the fields
// the scope does not read zeroed. It is the test's own statement of the
// scope, independent of the reader's.
func pathScope(h *Host) *Host {
	out := &Host{Scope: ScopePaths, Skipped: h.Skipped, Controllers: slices.Clone(h.Controllers), Subsystems: slices.Clone(h.Subsystems)}
	for i := range out.Controllers {
		c := &out.Controllers[i]
		c.CntlID, c.KATO, c.RawAddress, c.Address.SrcAddr = 0, 0, "", ""
		c.CtrlLossTmo, c.ReconnectDelay, c.FastIOFailTmo = Timeout{}, Timeout{}, Timeout{}
	}
	for i := range out.Subsystems {
		s := &out.Subsystems[i]
		s.IOPolicy = ""
		s.Namespaces = slices.Clone(s.Namespaces)
		for j := range s.Namespaces {
			ns := &s.Namespaces[j]
			ns.Sectors = 0
			ns.Paths = slices.Clone(ns.Paths)
			for k := range ns.Paths {
				ns.Paths[k].ANAGroup = 0
			}
		}
	}
	return out
}

// A second read of an unchanged host reads only what can change: per
// controller state, cntlid, kato, address and the three timeouts, per
// leg ana_state and ana_grpid, per subsystem iopolicy, per head size.
func TestReader_SecondReadReadsOnlyVolatileAttributes(t *testing.T) {
	fsys := materialize(t, twoPathTopology().Fixture())
	r := NewReader(fsys, ScopeAll)
	first, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	c1 := r.Counts()
	second, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	c2 := r.Counts()
	if d := cmp.Diff(first, second); d != "" {
		t.Fatalf("second read differs (-first +second):\n%s", d)
	}
	const volatile = 2*7 + 4*2 + 1 + 2
	got := sysfs.Counts{Reads: c2.Reads - c1.Reads, Lists: c2.Lists - c1.Lists, Stats: c2.Stats - c1.Stats}
	// Lists: class/nvme-subsystem, class/nvme, the subsystem, two
	// controllers. Stats: the two heads.
	if want := (sysfs.Counts{Reads: volatile, Lists: 5, Stats: 2}); got != want {
		t.Errorf("second read: %+v, want %+v (first read: %+v)", got, want, c1)
	}
	if c1.Reads <= volatile+10 {
		t.Errorf("first read opened only %d files", c1.Reads)
	}
}

// The Reader trusts an attribute fixed for an object's life only while
// the object's directory is the one it read it from. The kernel never
// rewrites such an attribute in place; a test that does sees the old
// value until the object is re-created, which is what makes the property
// test above more than a comparison of two full reads.
func TestReader_StaticAttributesFollowTheDirectoryIdentity(t *testing.T) {
	dir := t.TempDir()
	topo := twoPathTopology()
	tree, err := nvmetest.NewTree(dir, topo, testNow)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(tree.FS(), ScopeAll)
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	hostnqn := filepath.Join(dir, ctl(1), "hostnqn")
	if err := os.Chmod(hostnqn, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostnqn, []byte("nqn.2014-08.org.nvmexpress:uuid:rewritten\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := h.Controller("nvme1"); c.HostNQN == "nqn.2014-08.org.nvmexpress:uuid:rewritten" {
		t.Fatal("the Reader re-read hostnqn of an unchanged controller")
	}

	// The same name, a new controller: everything is read again.
	topo.Subsystems[0].Controllers[1].Gen++
	topo.Subsystems[0].Controllers[1].Age = time.Second
	if err := tree.Apply(topo); err != nil {
		t.Fatal(err)
	}
	h, err = r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(mustRead(t, tree.FS()), h); d != "" {
		t.Errorf("after nvme1 was re-created (-fresh +reader):\n%s", d)
	}
}

// The captures of real kernels replay through both readers with
// identical results (readertest.Captures).
func TestReader_ReplaysTheLabCaptures(t *testing.T) {
	readertest.Captures(t, filepath.Join(fixtureDir, "*.sysfs"), testNow,
		func(fsys sysfs.FS) readertest.Read[*Host] { return NewReader(fsys, ScopeAll).Read },
		func(fsys sysfs.FS) readertest.Read[*Host] { return func() (*Host, error) { return Read(fsys) } })
}

// A ScopePaths Reader reading an unchanged host again reads only
// controller state and ANA state, besides listing every directory and
// stating every head.
func TestReader_PathScopeReadsStateAndANAStateOnly(t *testing.T) {
	r := NewReader(materialize(t, twoPathTopology().Fixture()), ScopePaths)
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	c1 := r.Counts()
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	c2 := r.Counts()
	got := sysfs.Counts{Reads: c2.Reads - c1.Reads, Lists: c2.Lists - c1.Lists, Stats: c2.Stats - c1.Stats}
	if want := (sysfs.Counts{Reads: 2 + 4, Lists: 5, Stats: 2}); got != want {
		t.Errorf("second read: %+v, want %+v", got, want)
	}
}

// While a fabrics controller is being set up (the write to
// /dev/nvme-fabrics has not returned: connect, then identify) its
// directory is already in sysfs, but it has no subsystem yet: subsysnqn
// reads "(efault)", the kernel's text for a pointer into a NULL
// structure. A Reader that first read the controller then must read it
// again once it is set up, not keep "(efault)" for the controller's
// life. (Found by the soak: a controller seen during its connect stayed
// one of no subsystem, its path missing for minutes while it was live.)
func TestReader_ReadsTheSubsystemOnceAControllerIsSetUp(t *testing.T) {
	for _, scope := range []Scope{ScopeAll, ScopePaths} {
		dir := t.TempDir()
		tree, err := nvmetest.NewTree(dir, twoPathTopology(), testNow)
		if err != nil {
			t.Fatal(err)
		}
		write := func(name, value string) {
			t.Helper()
			p := filepath.Join(dir, ctl(1), name)
			if err := os.Chmod(p, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("state", "connecting")
		write("subsysnqn", "(efault)")
		r := NewReader(tree.FS(), scope)
		if _, err := r.Read(); err != nil {
			t.Fatal(err)
		}
		write("state", "live")
		write("subsysnqn", "nqn.2024-01.io.pathmend.test:a")
		h, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		fresh := NewReader(tree.FS(), scope)
		want, err := fresh.Read()
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, h); d != "" {
			t.Errorf("scope %v, after the controller was set up (-fresh +reader):\n%s", scope, d)
		}
		if c, _ := h.Controller("nvme1"); c.SubsysNQN != "nqn.2024-01.io.pathmend.test:a" {
			t.Errorf("scope %v: nvme1 subsysnqn %q after its setup", scope, c.SubsysNQN)
		}
	}
}

// forgetRememberedAddresses is where a long-lived Reader may differ from
// a fresh Read: the address of a fabrics controller that is not live is
// not read, so a fresh Read does not know it, and a Reader that saw the
// controller live remembers it. Each remembered address must be the
// controller's true one (in topo); it is then forgotten in h, as a fresh
// Read has it.
func forgetRememberedAddresses(t *testing.T, h *Host, topo nvmetest.Topology) {
	t.Helper()
	truth := map[int]nvmetest.Controller{}
	for _, s := range topo.Subsystems {
		for _, c := range s.Controllers {
			truth[c.Instance] = c.Effective()
		}
	}
	for i := range h.Controllers {
		c := &h.Controllers[i]
		if c.State == StateLive || !c.Fabrics() || c.AddressUnknown || c.Address == (Address{}) {
			continue
		}
		want, ok := truth[c.Name.Instance()]
		got := c.Address
		if !ok || got.Traddr != want.Traddr || got.Trsvcid != want.Trsvcid || got.HostTraddr != want.HostTraddr || got.HostIface != want.HostIface || got.SrcAddr != "" || c.RawAddress != "" {
			t.Fatalf("%s (%s) is remembered at %+v (raw %q); it goes to %s:%s", c.Name, c.State, got, c.RawAddress, want.Traddr, want.Trsvcid)
		}
		c.Address, c.AddressUnknown = Address{}, true
	}
}

// Answering for one volume reads its subsystem's objects only: on a
// steady host of 100 subsystems × 3 controllers, a ReadTarget reads the
// state of the subsystem's 3 controllers and the ANA state of their 3
// legs, lists the two class directories, the subsystem's and its
// controllers' directories, and stats its head — whatever the number of
// subsystems on the node.
func TestReader_ReadTargetReadsOnlyItsSubsystem(t *testing.T) {
	fsys := materialize(t, nvmetest.Healthy(100, 3, 1).Fixture())
	r := NewReader(fsys, ScopePaths)
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	const nqn = "nqn.2024-01.io.pathmend.test:sub-42"
	before := r.Counts()
	h, err := r.ReadTarget(nqn)
	if err != nil {
		t.Fatal(err)
	}
	got := r.Counts()
	got.Reads, got.Lists, got.Stats = got.Reads-before.Reads, got.Lists-before.Lists, got.Stats-before.Stats
	if got.Reads != 6 || got.Lists != 6 || got.Stats != 1 {
		t.Errorf("ReadTarget of one subsystem: %d attribute reads, %d listings, %d stats; want 6, 6, 1", got.Reads, got.Lists, got.Stats)
	}
	if len(h.Subsystems) != 1 || len(h.Controllers) != 3 || len(h.Subsystems[0].Namespaces[0].Paths) != 3 {
		t.Errorf("ReadTarget = %+v", h)
	}
}
