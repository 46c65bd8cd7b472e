package nodesim

import (
	"bytes"
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
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

var (
	schedules = flag.Int("schedules", 30, "schedules to run")
	seedFlag  = flag.Uint64("seed", 0, "run only this seed (0: seeds 1..schedules)")
	steps     = flag.Int("steps", 60, "scheduler steps per schedule before quiescence")
)

const (
	nqnA = "nqn.2014-08.io.pathmend.sim:a"
	nqnB = "nqn.2014-08.io.pathmend.sim:b"
	iqnT = "iqn.2024-01.io.example:t"
	// chapSecret must never reach a log line or a record.
	chapSecret = "sim-chap-Secret-7"
)

// coState is what the CO (kubelet) believes of a volume.
type coState int

const (
	unstaged coState = iota // never staged, or its NodeUnstage was acknowledged
	staged                  // its NodeStage was acknowledged
	unknown                 // an RPC failed or its process crashed: the CO will retry, or never come back
	busy                    // an RPC is running
)

// vol is one volume the CO may stage on the node.
type vol struct {
	id string
	vc map[string]string
	co coState
	// target is its volume.Target.
	target volume.Target
}

// parked is an actor waiting at a seam.
type parked struct {
	p    *process
	what string
	go1  chan bool
}

// sim is one schedule.
type sim struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	clk      *clocktesting.FakeClock
	kernel   *nvmetest.Kernel
	host     *iscsitest.Host
	mounts   *mount.FakeMounter
	stateDir string
	staging  string
	gen      int
	proc     *process
	vols     []*vol
	trace    []string
	ticking  bool

	mu     sync.Mutex
	parked []parked
	done   []result
}

// result is an actor that ended.
type result struct {
	v       *vol // nil for a tick
	op      string
	err     error
	crashed bool
	p       *process
}

func (s *sim) park(p *process, what string, go1 chan bool) {
	s.mu.Lock()
	s.parked = append(s.parked, parked{p, what, go1})
	s.mu.Unlock()
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
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

func newSim(t *testing.T, seed uint64) *sim {
	dir := scratch(t)
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		clk: clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)), mounts: newMounts(),
		stateDir: filepath.Join(dir, "state"), staging: filepath.Join(dir, "staging")}
	s.kernel = nvmetest.NewKernel(filepath.Join(dir, "nvme"), s.clk)
	s.kernel.AddTarget(nvmetest.SharedTarget(nqnA))
	s.kernel.AddTarget(nvmetest.SharedTarget(nqnB))
	var err error
	if s.host, err = iscsitest.NewHost(filepath.Join(dir, "sys"), filepath.Join(dir, "dev")); err != nil {
		t.Fatal(err)
	}
	s.host.Target, s.host.LUNs = iqnT, []int{0, 1}
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
	s.proc = s.start()
	return s
}

// spawn runs an actor of the current process on its own goroutine.
func (s *sim) spawn(v *vol, op string, f func(p *process) error) {
	p := s.proc
	p.actors.Add(1)
	go func() {
		r := result{v: v, op: op, p: p}
		defer func() {
			if x := recover(); x != nil {
				if _, ok := x.(crash); !ok {
					panic(x)
				}
				r.crashed = true
			}
			p.actors.Add(-1)
			s.mu.Lock()
			s.done = append(s.done, r)
			s.mu.Unlock()
		}()
		r.err = f(p)
	}()
}

func (s *sim) stage(v *vol) {
	v.co = busy
	s.logf("NodeStage %s", v.id)
	req := &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: stagingDir(s.staging, v.id), VolumeContext: v.vc,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}
	if v.target.Transport == volume.TransportISCSI {
		req.Secrets = map[string]string{"chapUsername": "sim-user", "chapPassword": chapSecret}
	}
	s.spawn(v, "NodeStage", func(p *process) error {
		_, err := p.drv.NodeStageVolume(context.Background(), req)
		return err
	})
}

func (s *sim) unstage(v *vol) {
	v.co = busy
	s.logf("NodeUnstage %s", v.id)
	req := &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: stagingDir(s.staging, v.id)}
	s.spawn(v, "NodeUnstage", func(p *process) error {
		_, err := p.drv.NodeUnstageVolume(context.Background(), req)
		return err
	})
}

func (s *sim) tick() {
	s.ticking = true
	s.logf("tick")
	s.spawn(nil, "tick", func(p *process) error { p.mon.Tick(context.Background()); return nil })
}

// collect reads the actors that ended into the CO's view.
func (s *sim) collect() {
	s.mu.Lock()
	done := s.done
	s.done = nil
	s.mu.Unlock()
	for _, r := range done {
		if r.v == nil {
			s.ticking = false
			if r.crashed {
				s.logf("  tick crashed")
			}
			continue
		}
		switch {
		case r.crashed:
			r.v.co = unknown
			s.logf("  %s %s: crashed", r.op, r.v.id)
		case r.err != nil:
			r.v.co = unknown
			s.logf("  %s %s: %v", r.op, r.v.id, driver.ToStatus(r.err))
		case r.op == "NodeStage":
			r.v.co = staged
			s.logf("  %s %s: ok", r.op, r.v.id)
		default:
			r.v.co = unstaged
			s.logf("  %s %s: ok", r.op, r.v.id)
		}
	}
}

// release lets the parked actor i through (or, with ok false, kills it).
func (s *sim) release(i int, ok bool) {
	s.mu.Lock()
	p := s.parked[i]
	s.parked = slices.Delete(s.parked, i, i+1)
	s.mu.Unlock()
	if ok {
		s.logf("  %s", p.what)
	}
	p.go1 <- ok
}

// settle waits until every actor is parked, blocked or done, letting
// bubble time pass for actors asleep in a poll loop, and reads the ended
// ones. It returns the number parked.
func (s *sim) settle() int {
	for range 10000 {
		synctest.Wait()
		s.collect()
		s.mu.Lock()
		n := len(s.parked)
		s.mu.Unlock()
		if n > 0 || s.proc.actors.Load() == 0 {
			return n
		}
		time.Sleep(10 * time.Millisecond) // actors polling sysfs
	}
	s.fail("actors neither park nor end: a deadlock")
	return 0
}

// crashNow kills the process at this point: every actor unwinds at its
// next seam, and a new process starts over the same kernel and disk.
func (s *sim) crashNow() {
	old := s.proc
	s.logf("CRASH (process %d)", old.gen)
	old.crashed.Store(true)
	for old.actors.Load() > 0 {
		synctest.Wait()
		s.mu.Lock()
		var mine []int
		for i := len(s.parked) - 1; i >= 0; i-- {
			if s.parked[i].p == old {
				mine = append(mine, i)
			}
		}
		s.mu.Unlock()
		for _, i := range mine {
			s.release(i, false)
		}
		if len(mine) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	synctest.Wait()
	s.collect()
	s.proc = s.start()
}

// step takes one scheduling decision.
func (s *sim) step() {
	n := s.settle()
	s.check()
	switch x := s.rng.IntN(100); {
	case x < 3 && (n > 0 || s.proc.actors.Load() > 0):
		s.crashNow()
	case x < 55 && n > 0:
		s.release(s.rng.IntN(n), true)
	case x < 65:
		if !s.ticking {
			s.tick()
		}
	case x < 70:
		d := time.Duration(s.rng.IntN(400)) * time.Second
		s.logf("clock +%s", d)
		s.clk.Step(d)
		s.kernel.Refresh()
	default:
		v := s.vols[s.rng.IntN(len(s.vols))]
		if v.co == busy {
			return
		}
		if s.rng.IntN(2) == 0 {
			s.stage(v)
		} else {
			s.unstage(v)
		}
	}
}

// drain runs every actor to its end, in random order.
func (s *sim) drain() {
	for {
		n := s.settle()
		s.check()
		if n == 0 && s.proc.actors.Load() == 0 {
			return
		}
		s.release(s.rng.IntN(n), true)
	}
}

// quiesce ends the schedule: every actor finishes; the CO settles each
// volume it does not know (retries NodeStage or NodeUnstage until it is
// acknowledged, or never comes back); the monitor ticks past the grace and
// the intent timeout.
func (s *sim) quiesce() {
	s.logf("QUIESCE")
	s.drain()
	for _, v := range s.vols {
		if v.co != unknown {
			continue
		}
		switch s.rng.IntN(3) {
		case 0: // the CO never comes back: reconciliation's
			s.logf("CO abandons %s", v.id)
			continue
		case 1:
			for try := 0; v.co != staged; try++ {
				if try == 5 {
					s.fail("NodeStage of %s never succeeds", v.id)
				}
				s.stage(v)
				s.drain()
			}
		default:
			for try := 0; v.co != unstaged; try++ {
				if try == 5 {
					s.fail("NodeUnstage of %s never succeeds", v.id)
				}
				s.unstage(v)
				s.drain()
			}
		}
	}
	for _, d := range []time.Duration{6 * time.Second, 6 * time.Minute, 6 * time.Second, 6 * time.Second} {
		s.clk.Step(d)
		s.kernel.Refresh()
		s.tick()
		s.drain()
	}
	s.checkQuiescent()
}

// fail reports a violation with the seed and the trace, then kills the
// process so that no actor is left parked in the bubble.
func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	s.t.Errorf("seed %d: %s\ntrace:\n%s", s.seed, fmt.Sprintf(format, args...), strings.Join(s.trace, "\n"))
	s.crashNow()
	s.t.FailNow()
}

// records reads the records of the node.
func (s *sim) records() volume.Listing {
	store, err := volume.NewStore(s.stateDir)
	if err != nil {
		s.fail("%v", err)
	}
	l, err := store.Scan()
	if err != nil {
		s.fail("%v", err)
	}
	return l
}

// check tests what must hold after every step.
func (s *sim) check() {
	l := s.records()
	if len(l.Unreadable) > 0 {
		s.fail("unreadable record: %v", l.Err())
	}
	// An acknowledged staged volume keeps every path: no fault is
	// injected, so only an action for another volume or by the monitor
	// could take one.
	h, err := nvme.Read(s.kernel.FS())
	if err != nil {
		s.fail("read nvme: %v", err)
	}
	for _, v := range s.vols {
		if v.co != staged {
			continue
		}
		if live, want, why := s.livePaths(h, v); live < want {
			s.fail("staged volume %s has %d of %d paths: %s", v.id, live, want, why)
		}
	}
	// Nothing of a target no record names.
	named := map[volume.Target]bool{}
	for _, r := range l.Records {
		named[r.Target()] = true
	}
	for _, nqn := range []string{nqnA, nqnB} {
		t := volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}
		if named[t] {
			continue
		}
		for _, c := range h.Controllers {
			if c.SubsysNQN == nqn {
				s.fail("controller %s of %s, which no record names", c.Name, nqn)
			}
		}
	}
	if !named[volume.Target{Transport: volume.TransportISCSI, Name: iqnT}] {
		if k := s.host.SessionKeys(); len(k) > 0 {
			s.fail("sessions %v of a target no record names", k)
		}
		if k := s.host.RecordKeys(); len(k) > 0 {
			s.fail("node records %v of a target no record names", k)
		}
	}
}

// livePaths counts a volume's live paths and the paths it expects, and
// says what is wrong.
func (s *sim) livePaths(h *nvme.Host, v *vol) (live, want int, why string) {
	c, _, err := volume.Parse(v.vc, nil)
	if err != nil {
		s.fail("%v", err)
	}
	if v.target.Transport == volume.TransportNVMeTCP {
		e, _ := nvme.ExpectationFromRecord(volume.Record{VolumeID: v.id, Context: c})
		r := nvme.ConditionOf(nvme.ReportPaths(h, e))
		p := nvme.ReportPaths(h, e)
		return p.Live, p.Expected, r.Message
	}
	cond := s.proc.iscsi.Health(context.Background(), volume.Record{VolumeID: v.id, Context: c})
	if cond.Status == driver.Healthy {
		return 2, 2, cond.Message
	}
	return 0, 2, cond.Message
}

// checkQuiescent: the kernel holds exactly what the records need, and no
// interrupted intent is left but one whose device is in use.
func (s *sim) checkQuiescent() {
	l := s.records()
	need := map[string]map[string]bool{} // NQN or IQN → endpoints/portals
	for _, r := range l.Records {
		if r.State == volume.StateDetaching {
			s.fail("record of %s left detaching at quiescence", r.VolumeID)
		}
		if r.State == volume.StateAttaching {
			if mounted, _ := s.mounts.IsMountPoint(r.StagingPath); !mounted {
				s.fail("record of %s left attaching with nothing using it", r.VolumeID)
			}
		}
		t := r.Target()
		if need[t.Name] == nil {
			need[t.Name] = map[string]bool{}
		}
		if n := r.Context.NVMe; n != nil {
			for _, ep := range n.Endpoints {
				need[t.Name][ep.String()] = true
			}
		}
		if i := r.Context.ISCSI; i != nil {
			for _, ep := range i.Portals {
				need[t.Name][ep.String()] = true
			}
		}
	}
	h, err := nvme.Read(s.kernel.FS())
	if err != nil {
		s.fail("%v", err)
	}
	for _, nqn := range []string{nqnA, nqnB} {
		got := map[string]int{}
		for _, c := range h.Controllers {
			if c.SubsysNQN == nqn {
				got[c.Endpoint().String()[len("tcp "):]]++
			}
		}
		for ep, n := range got {
			if !need[nqn][ep] || n != 1 {
				s.fail("%s: %d controllers to %s, records need %v", nqn, n, ep, need[nqn])
			}
		}
		for ep := range need[nqn] {
			if got[ep] == 0 {
				s.fail("%s: no controller to %s the records need", nqn, ep)
			}
		}
	}
	var wantKeys []string
	for ep := range need[iqnT] {
		wantKeys = append(wantKeys, iqnT+","+ep)
	}
	slices.Sort(wantKeys)
	if got := s.host.SessionKeys(); !slices.Equal(got, wantKeys) {
		s.fail("sessions %v, records need %v", got, wantKeys)
	}
	if got := s.host.RecordKeys(); !slices.Equal(got, wantKeys) {
		s.fail("node records %v, records need %v", got, wantKeys)
	}
}

// run is one schedule.
func run(t *testing.T, seed uint64) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, seed)
		for range *steps {
			s.step()
		}
		s.quiesce()
	})
}

// logs captures every log line of the schedules: no secret may appear in
// one.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// take returns what was logged since the last take.
func (l *logs) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	l.buf.Reset()
	return s
}

// TestSimulation runs -schedules schedules (or the one -seed) and ends
// with "N schedules, 0 violations".
func TestSimulation(t *testing.T) {
	captured := &logs{}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	_ = fs.Set("v", "5")
	klog.SetOutput(captured)
	t.Cleanup(func() { _ = fs.Set("logtostderr", "true"); klog.SetOutput(os.Stderr) })
	seeds := []uint64{*seedFlag}
	if *seedFlag == 0 {
		seeds = seeds[:0]
		for i := range *schedules {
			seeds = append(seeds, uint64(i)+1)
		}
	}
	violations := 0
	for _, seed := range seeds {
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			run(t, seed)
			klog.Flush()
			if out := captured.take(); strings.Contains(out, chapSecret) {
				i := strings.Index(out, chapSecret)
				t.Errorf("seed %d: a secret in the logs: …%s…", seed, out[max(0, i-200):i+len(chapSecret)])
			}
		})
		if !ok {
			violations++
			if violations >= 3 {
				break
			}
		}
	}
	t.Logf("%d schedules, %d violations", len(seeds), violations)
	fmt.Printf("%d schedules, %d violations\n", len(seeds), violations)
	if violations > 0 {
		t.Fail()
	}
}
