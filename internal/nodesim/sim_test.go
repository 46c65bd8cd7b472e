package nodesim

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

var (
	schedules = flag.Int("schedules", 200, "schedules to run (seeds -first … -first+schedules-1)")
	firstSeed = flag.Uint64("first", 1, "the first seed")
	seedFlag  = flag.Uint64("seed", 0, "run only this seed (0: -schedules seeds from -first)")
	steps     = flag.Int("steps", 60, "scheduler steps per schedule before quiescence")
	showTrace = flag.Bool("trace", false, "log the trace of every schedule, also a passing one")
)

const (
	nqnA = "nqn.2014-08.io.pathmend.sim:a"
	nqnB = "nqn.2014-08.io.pathmend.sim:b"
	iqnT = "iqn.2024-01.io.example:t"
	// chapSecret must never reach a log line or a record.
	chapSecret = "sim-chap-Secret-7"
	// phantom is the volume of the unreadable record the scheduler puts
	// in the state directory: written by a newer pathmend, naming a
	// target of the node.
	phantom = "zz-from-a-newer-pathmend"
)

// coState is what the CO (kubelet) believes of a volume's stage, or of
// its one publication.
type coState int

const (
	absent  coState = iota // never staged (published), or its NodeUnstage (NodeUnpublish) was acknowledged
	done                   // its NodeStage (NodePublish) was acknowledged
	unknown                // an RPC failed or its process crashed: the CO will retry, or never come back
)

// vol is one volume the CO may stage and publish on the node.
type vol struct {
	id     string
	vc     map[string]string
	target volume.Target
	// stage and pub are the CO's view; busy is set while one of its RPCs
	// runs (kubelet runs one operation per volume at a time).
	stage, pub coState
	busy       bool
	// lastErr is the error of its last RPC that failed.
	lastErr string
}

// parked is an actor waiting at a seam.
type parked struct {
	p    *process
	what string
	seq  uint64
	go1  chan bool
}

// sim is one schedule.
type sim struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	// probes decides kubelet's health probes (probeHealth).
	probes   *rand.Rand
	clk      *clocktesting.FakeClock
	kernel   *nvmetest.Kernel
	nvme     *nvme.Reader // the scheduler's reader of the NVMe tree
	host     *iscsitest.Host
	mounts   *mountstest.Table
	stateDir string
	root     string
	gen      int
	proc     *process
	vols     []*vol
	trace    []string
	ticking  bool
	failing  bool
	// pending are the kernel events announced and not yet delivered to
	// the process's loop (events_test.go).
	pending []uevent.Event
	// quiescing: the faults are over, and a restart finds no newer
	// pathmend's record any more.
	quiescing bool
	faults    faults
	// dirty is set when the node may have changed since the last check;
	// faulted when a fault was injected since then (the one way a staged
	// volume may lose a path); live is each staged volume's live paths at
	// the last check.
	dirty, faulted bool
	live           map[string]counted
	stats          *stats

	mu      sync.Mutex
	seq     uint64
	parked  []parked
	ended   []result
	wake    chan struct{}
	seamErr []string // violations seen inside an actor, reported by check
	// recEpoch counts changes of the records, iscsiEpoch of the iSCSI
	// host; recCache holds the records read at recCacheAt.
	recEpoch, iscsiEpoch, recCacheAt int
	recCache                         []volume.Record
}

// result is an actor that ended.
type result struct {
	v       *vol // nil for a tick
	op      string
	err     error
	crashed bool
}

func (s *sim) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sim) park(p *process, what string, go1 chan bool) {
	what = s.clean(what)
	s.mu.Lock()
	s.seq++
	s.parked = append(s.parked, parked{p, what, s.seq, go1})
	s.mu.Unlock()
	s.signal()
}

// violation records a broken invariant seen by an actor at a seam; the
// scheduler reports it at its next check.
func (s *sim) violation(format string, args ...any) {
	s.mu.Lock()
	s.seamErr = append(s.seamErr, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, s.clean(fmt.Sprintf(format, args...)))
}

// clean makes a trace line the same in every run of the seed (paths
// relative to the schedule's scratch directory) and fit to print (no
// secret: the sim's own trace shows the iscsiadm command lines).
func (s *sim) clean(line string) string {
	return strings.ReplaceAll(strings.ReplaceAll(line, s.root, ""), chapSecret, "<secret>")
}

// scratch is a directory for one schedule's trees, on tmpfs (/dev/shm)
// when the machine has one: a schedule fsyncs dozens of records, which a
// disk makes ten times slower.
func scratch(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "nodesim-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func newSim(t *testing.T, seed uint64, st *stats) *sim {
	dir := scratch(t)
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), probes: rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d)),
		clk: clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)), mounts: mountstest.New(),
		stateDir: filepath.Join(dir, "state"), root: dir, wake: make(chan struct{}, 1),
		live: map[string]counted{}, stats: st, dirty: true, recCacheAt: -1}
	s.kernel = nvmetest.NewKernelInPlace(filepath.Join(dir, "nvme"), s.clk)
	s.nvme = nvme.NewReader(s.kernel.FS(), nvme.ScopeAll)
	s.kernel.AddTarget(nvmetest.SharedTarget(nqnA))
	s.kernel.AddTarget(nvmetest.SharedTarget(nqnB))
	var err error
	if s.host, err = iscsitest.NewHost(filepath.Join(dir, "sys"), filepath.Join(dir, "dev")); err != nil {
		t.Fatal(err)
	}
	s.host.Target, s.host.LUNs = iqnT, []int{0, 1}
	s.mounts.DevOf = mountstest.SysfsDevices(s.kernel.FS(), sysfs.New(s.host.Sys))
	// No foreign layer is ever unmounted: not at, on, under or over a
	// path pathmend recorded, whatever else happens.
	s.mounts.OnUnmount = func(l mounts.Layer, foreign bool) {
		if foreign {
			s.violation("a foreign layer was unmounted: %s at %s", l, l.MountPoint)
		}
	}
	nv := func(id, nqn string, nsid int) *vol {
		return &vol{id: id, target: volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}, vc: map[string]string{
			"transport": "nvme-tcp", "nqn": nqn, "endpoints": "127.0.0.1:4420,127.0.0.2:4420",
			"optimizedEndpoints": "127.0.0.1:4420", "nsid": fmt.Sprint(nsid)}}
	}
	is := func(id string, lun int) *vol {
		return &vol{id: id, target: volume.Target{Transport: volume.TransportISCSI, Name: iqnT}, vc: map[string]string{
			"transport": "iscsi", "iqn": iqnT, "portals": "127.0.0.1,127.0.0.2", "lun": fmt.Sprint(lun)}}
	}
	s.vols = []*vol{nv("a1", nqnA, 1), nv("a2", nqnA, 2), nv("b1", nqnB, 1), is("i0", 0), is("i1", 1)}
	s.kernel.Announce()
	s.host.Announce()
	s.proc = s.start()
	return s
}

// spawn runs an actor of the current process on its own goroutine.
func (s *sim) spawn(v *vol, op string, f func(p *process) error) {
	p := s.proc
	p.actors.Add(1)
	if v != nil {
		v.busy = true
	}
	s.logf("%s %s", op, v.name())
	go func() {
		r := result{v: v, op: op}
		defer func() {
			if x := recover(); x != nil {
				if _, ok := x.(crash); !ok {
					panic(x)
				}
				r.crashed = true
			}
			p.actors.Add(-1)
			s.mu.Lock()
			s.ended = append(s.ended, r)
			s.mu.Unlock()
			s.signal()
		}()
		r.err = f(p)
	}()
}

func (v *vol) name() string {
	if v == nil {
		return ""
	}
	return v.id
}

func (s *sim) stagingPath(v *vol) string { return filepath.Join(s.root, "kubelet", "staging", v.id) }
func (s *sim) publishPath(v *vol) string {
	return filepath.Join(s.root, "kubelet", "pods", v.id, "mount")
}

func capability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func (s *sim) stage(v *vol) {
	req := &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: mkdir(s.stagingPath(v)), VolumeContext: v.vc,
		VolumeCapability: capability()}
	if v.target.Transport == volume.TransportISCSI {
		req.Secrets = map[string]string{"chapUsername": "sim-user", "chapPassword": chapSecret}
	}
	s.spawn(v, "NodeStage", func(p *process) error {
		_, err := p.drv.NodeStageVolume(context.Background(), req)
		return err
	})
}

func (s *sim) unstage(v *vol) {
	req := &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: s.stagingPath(v)}
	s.spawn(v, "NodeUnstage", func(p *process) error {
		_, err := p.drv.NodeUnstageVolume(context.Background(), req)
		return err
	})
}

func (s *sim) publish(v *vol) {
	req := &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: s.stagingPath(v), TargetPath: s.publishPath(v),
		VolumeContext: v.vc, VolumeCapability: capability()}
	s.spawn(v, "NodePublish", func(p *process) error {
		_, err := p.drv.NodePublishVolume(context.Background(), req)
		return err
	})
}

func (s *sim) unpublish(v *vol) {
	req := &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: s.publishPath(v)}
	s.spawn(v, "NodeUnpublish", func(p *process) error {
		_, err := p.drv.NodeUnpublishVolume(context.Background(), req)
		return err
	})
}

func (s *sim) tick() {
	s.ticking = true
	s.spawn(nil, "tick", func(p *process) error { p.mon.Tick(context.Background()); return nil })
}

// collect reads the actors that ended into the CO's view.
func (s *sim) collect() {
	s.mu.Lock()
	ended := s.ended
	s.ended = nil
	s.mu.Unlock()
	// Actors that end within one settle end in any order.
	slices.SortFunc(ended, func(a, b result) int {
		return strings.Compare(a.op+" "+a.v.name(), b.op+" "+b.v.name())
	})
	for _, r := range ended {
		s.dirty = true
		if r.v == nil {
			s.ticking = false
			if r.crashed {
				s.logf("  tick crashed")
			}
			continue
		}
		r.v.busy = false
		state := &r.v.stage
		if r.op == "NodePublish" || r.op == "NodeUnpublish" {
			state = &r.v.pub
		}
		switch {
		case r.crashed:
			*state = unknown
			s.logf("  %s %s: crashed", r.op, r.v.id)
		case r.err != nil:
			*state = unknown
			r.v.lastErr = r.err.Error()
			s.logf("  %s %s: %v", r.op, r.v.id, driver.ToStatus(r.err))
		case r.op == "NodeStage" || r.op == "NodePublish":
			*state = done
			s.logf("  %s %s: ok", r.op, r.v.id)
		default:
			*state = absent
			s.logf("  %s %s: ok", r.op, r.v.id)
		}
	}
}

// settle waits until every actor is parked, blocked or done (bubble time
// passes for actors asleep in a poll loop), reads the ended ones and
// orders the parked ones the same way in every run of the seed. It
// returns the number parked.
func (s *sim) settle() int {
	for {
		synctest.Wait()
		s.collect()
		s.mu.Lock()
		n := len(s.parked)
		s.sortParked()
		s.mu.Unlock()
		if n > 0 || s.proc.actors.Load() == 0 {
			return n
		}
		// Every actor is blocked and none parked. One waiting on the
		// node's injected clock (a repair's rescan wait) sees it move on
		// by its poll step.
		if s.clk.HasWaiters() {
			s.clk.Step(100 * time.Millisecond)
			s.kernel.Refresh()
			continue
		}
		// Or one is asleep in bubble time (a poll, a retry's backoff):
		// let bubble time run until an actor parks or ends; an hour of it
		// means none ever will.
		timer := time.NewTimer(time.Hour)
		select {
		case <-s.wake:
			timer.Stop()
		case <-timer.C:
			s.fail("actors neither park nor end for an hour of bubble time: a deadlock")
		}
	}
}

// sortParked orders the parked actors the same way in every run of the
// seed, whatever order they arrived in within one settle. s.mu is held.
func (s *sim) sortParked() {
	slices.SortFunc(s.parked, func(a, b parked) int {
		if a.p.gen != b.p.gen {
			return a.p.gen - b.p.gen
		}
		if c := strings.Compare(a.what, b.what); c != 0 {
			return c
		}
		return int(a.seq - b.seq)
	})
}

// release lets the parked actor i through (or, with ok false, kills it).
func (s *sim) release(i int, ok bool) {
	s.mu.Lock()
	p := s.parked[i]
	s.parked = slices.Delete(s.parked, i, i+1)
	s.mu.Unlock()
	s.dirty = true
	if ok {
		s.logf("  %s", p.what)
		s.stats.released(seamKind(p.what))
	} else {
		s.stats.crashedAt(seamKind(p.what))
	}
	p.go1 <- ok
}

// crashNow kills the process at this point: every actor unwinds at its
// next seam, and a new process starts over the same kernel and disk.
func (s *sim) crashNow() {
	old := s.proc
	s.logf("CRASH (process %d)", old.gen)
	old.crashed.Store(true)
	s.dirty = true
	for {
		synctest.Wait()
		s.mu.Lock()
		s.sortParked()
		var mine []int
		for i := len(s.parked) - 1; i >= 0; i-- {
			if s.parked[i].p == old {
				mine = append(mine, i)
			}
		}
		s.mu.Unlock()
		if len(mine) == 0 && old.actors.Load() == 0 {
			break
		}
		for _, i := range mine {
			s.release(i, false)
		}
		if len(mine) == 0 && s.clk.HasWaiters() {
			s.clk.Step(100 * time.Millisecond)
			s.kernel.Refresh()
			continue
		}
		if len(mine) == 0 {
			timer := time.NewTimer(time.Hour)
			select {
			case <-s.wake:
				timer.Stop()
			case <-timer.C:
				s.fail("a crashed process's actors never unwind")
			}
		}
	}
	synctest.Wait()
	s.collect()
	if !s.quiescing && s.rng.IntN(4) == 0 {
		s.putPhantom()
	}
	if s.rng.IntN(2) == 0 {
		// The plugin's container restarted: a new mount namespace, whose
		// copy of every mount has a new ID.
		s.logf("new mount namespace")
		s.mounts.NewNamespace()
	}
	s.proc = s.start()
}

// step takes one scheduling decision.
func (s *sim) step() {
	n := s.settle()
	s.check()
	// kubelet's health probes come from a stream of their own, so that the
	// scheduling decisions of a seed stay what they were without them.
	if s.probes.IntN(3) == 0 {
		for _, v := range s.vols {
			s.probeHealth(v)
		}
	}
	switch x := s.rng.IntN(100); {
	case x < 3 && (n > 0 || s.proc.actors.Load() > 0):
		if n == 0 {
			s.stats.crashedAt("blocked")
		}
		s.crashNow()
	case x < 53 && n > 0:
		s.release(s.rng.IntN(n), true)
	case x < 57:
		if !s.ticking {
			s.tick()
		}
	case x < 61:
		if !s.ticking {
			s.deliverEvents()
		}
	case x < 65:
		d := time.Duration(s.rng.IntN(400)) * time.Second
		s.logf("clock +%s", d)
		s.clk.Step(d)
		s.kernel.Refresh()
		s.dirty = true
	case x < 72:
		s.fault()
	default:
		s.request(s.vols[s.rng.IntN(len(s.vols))])
	}
}

// request has the CO send v one RPC that kubelet could send now: stage
// what a pod needs, publish it, unpublish when the pod ends, unstage what
// nothing publishes; retry what it does not know either way.
func (s *sim) request(v *vol) {
	if v.busy {
		return
	}
	x := s.rng.IntN(10)
	switch {
	case v.pub != absent && x < 6: // the pod ends (or the CO retries)
		s.unpublish(v)
	case v.pub == unknown:
		s.publish(v)
	case v.pub == done:
		s.stage(v) // kubelet's periodic re-stage of a mounted volume
	case v.stage == done && x < 5: // a pod starts
		s.publish(v)
	case v.stage == absent || x < 7:
		s.stage(v)
	default:
		s.unstage(v)
	}
}

// drain runs every actor to its end, in random order.
func (s *sim) drain() { s.drainCrashing(false) }

// drainCrashing is drain that may also crash the process once at a seam
// on the way (the CO's first try of a settling RPC, so that crashes reach
// the teardowns that happen mostly at quiescence: logouts, map flushes,
// disk deletes).
func (s *sim) drainCrashing(crash bool) {
	for {
		n := s.settle()
		s.check()
		if n == 0 && s.proc.actors.Load() == 0 {
			return
		}
		if crash && s.rng.IntN(20) == 0 {
			crash = false
			s.crashNow()
			continue
		}
		s.release(s.rng.IntN(n), true)
	}
}

// settleCO has the CO settle what it does not know: it retries until the
// RPC is acknowledged, or never comes back.
func (s *sim) settleCO(v *vol, state *coState, want coState, retry func(*vol)) {
	if *state != want && want == absent {
		*state = unknown // an RPC it never sent settles nothing
	}
	for try := 0; *state != want; try++ {
		if try == 5 && want == done && (strings.Contains(v.lastErr, "mount of another device") || strings.Contains(v.lastErr, "stage it again")) {
			// The kernel replaced the volume's device (its namespace was
			// disabled and enabled): the old mount is dead, and the CO
			// must unstage and stage again (docs/operations.md). Or an
			// operator's umount -l of a foreign mount took the volume's
			// staging mount along: its pods are restarted.
			s.logf("CO gives up on %s: its device was replaced, or its staging mount is gone", v.id)
			s.settleCO(v, &v.pub, absent, s.unpublish)
			s.settleCO(v, &v.stage, absent, s.unstage)
			return
		}
		if try == 5 {
			s.fail("%s of %s never succeeds", map[coState]string{done: "setting up", absent: "tearing down"}[want], v.id)
		}
		retry(v)
		s.drainCrashing(try == 0)
	}
}

// quiesce ends the schedule: every actor finishes; the faults end and an
// operator removes the unreadable record; the CO settles each volume it
// does not know; the monitor ticks past the grace, the heal's thresholds
// and the intent timeout.
func (s *sim) quiesce() {
	s.logf("QUIESCE")
	s.drain()
	s.healFaults()
	s.quiescing = true
	for _, v := range s.vols {
		if v.pub == unknown || v.stage == unknown {
			switch s.rng.IntN(4) {
			case 0: // the CO never comes back: the reconciliation's
				s.logf("CO abandons %s", v.id)
				continue
			case 1:
				if v.stage == unknown {
					s.settleCO(v, &v.stage, done, s.stage)
				}
				if v.pub == unknown {
					s.settleCO(v, &v.pub, done, s.publish)
				}
				continue
			}
		}
		if v.stage == unknown && v.pub != absent || v.pub == unknown {
			s.settleCO(v, &v.pub, absent, s.unpublish)
		}
		if v.stage == unknown {
			s.settleCO(v, &v.stage, absent, s.unstage)
		}
	}
	// Half the schedules end with the node drained: every pod gone, every
	// volume unstaged, and nothing of any target may be left.
	if s.rng.IntN(2) == 0 {
		s.logf("DRAIN")
		for _, v := range s.vols {
			if v.pub != absent {
				s.settleCO(v, &v.pub, absent, s.unpublish)
			}
			s.settleCO(v, &v.stage, absent, s.unstage)
		}
	}
	for _, d := range []time.Duration{6 * time.Second, 6 * time.Minute, 6 * time.Second, 6 * time.Second} {
		s.logf("clock +%s", d)
		s.clk.Step(d)
		s.kernel.Refresh()
		s.dirty = true
		s.deliverAll()
		s.drain()
		s.tick()
		s.drain()
	}
	s.checkQuiescent()
}

// fail reports a violation with the seed and the trace, then kills the
// process so that no actor is left parked in the bubble.
func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	if s.failing { // the crash below failed too
		s.t.FailNow()
	}
	s.failing = true
	s.t.Errorf("seed %d: %s\nreplay: go test ./internal/nodesim -run 'TestSimulation$' -seed=%d -steps=%d\ntrace:\n%s",
		s.seed, fmt.Sprintf(format, args...), s.seed, *steps, strings.Join(s.trace, "\n"))
	s.crashNow()
	s.t.FailNow()
}

// run is one schedule; it returns its trace.
func run(t *testing.T, seed uint64, st *stats) []string {
	var trace []string
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, seed, st)
		for range *steps {
			s.step()
		}
		s.quiesce()
		trace = s.trace
		if *showTrace {
			t.Logf("seed %d:\n%s", seed, strings.Join(s.trace, "\n"))
		}
	})
	return trace
}

// mkdir makes a directory (a staging path kubelet creates) and returns it.
func mkdir(p string) string {
	if err := os.MkdirAll(p, 0o750); err != nil {
		panic(err)
	}
	return p
}
