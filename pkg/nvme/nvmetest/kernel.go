package nvmetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// Target is one NVMe/TCP subsystem on the fake fabric.
type Target struct {
	NQN        string
	Namespaces []Namespace
	// Ports maps "host:port" to the ANA state the target reports on it
	// ("optimized", "non-optimized", "inaccessible").
	Ports map[string]string
}

// SharedTarget is a subsystem of two namespaces (nsid 1 and 2, UUIDs
// 6a0e2d4c-0000-4000-8000-00000000000N) exported on two ports,
// 127.0.0.1:4420 ANA-optimized and 127.0.0.2:4420 non-optimized: the
// smallest target two volumes share.
func SharedTarget(nqn string) Target {
	return Target{
		NQN: nqn,
		Namespaces: []Namespace{
			{Head: 1, NSID: 1, UUID: "6a0e2d4c-0000-4000-8000-000000000001"},
			{Head: 2, NSID: 2, UUID: "6a0e2d4c-0000-4000-8000-000000000002"},
		},
		Ports: map[string]string{"127.0.0.1:4420": "optimized", "127.0.0.2:4420": "non-optimized"},
	}
}

// Kernel is a deterministic fake of the host's NVMe-oF stack for tests:
// a sysfs tree in a directory (laid out by Topology) plus the fabrics
// operations pathmend performs. Connect creates a controller directory
// whose mtime is the connect time, and attaches its namespace legs
// LegDelay later (the race a monitor must not mistake for a defect);
// Disconnect removes it; faults are injected with the Set methods. It
// implements the Connector of package nvme.
type Kernel struct {
	// LegDelay is how long after a connect the controller's legs appear.
	LegDelay time.Duration

	mu      sync.Mutex
	dir     string
	gen     int
	clk     clock.WithDelayedExecution
	targets map[string]*Target
	ctrls   []*fakeCtrl
	next    int
	subsys  map[string]int // NQN → subsystem instance
	down    map[string]bool
	hidden  map[string]map[uint32]bool // NQN → disabled nsids
	noLeg   map[int]bool               // controller instance → never attaches legs
	calls   []string
	// shown is what the tree shows now (ages as creation times); a write
	// that would show the same is skipped.
	shown string
	// inPlace (NewKernelInPlace) changes one tree in place; tree is it,
	// its ages counting back from since. connects counts the controllers
	// created under each instance number, so that one created again
	// under a reused number is a new object.
	inPlace  bool
	tree     *Tree
	since    time.Time
	connects map[int]int
	opts     []fabrics.Options

	// Namespace heads the host has now, per NQN and nsid: a head is
	// created when the host first sees the namespace and removed when it
	// loses it (namespace disabled, or the subsystem's last controller
	// gone), so a namespace that comes back is a new head with a new
	// device number, as on Linux.
	heads     map[string]map[uint32]fakeHead
	lastHead  map[string]int
	lastMinor int
	// held lists the NQNs whose namespace-change events the host does not
	// get; unseen holds namespaces enabled meanwhile, which the host finds
	// only by a rescan (or a new connect, which scans).
	held   map[string]bool
	unseen map[string]map[uint32]bool

	// announce (Announce) makes every change queue the uevents the
	// kernel sends for it; last is what the previous change showed.
	announce bool
	last     Topology
	seq      uint64
	uevents  []uevent.Event
}

type fakeHead struct {
	instance, minor int
}

type fakeCtrl struct {
	instance int
	nqn      string
	host     string
	port     string
	state    string
	created  time.Time
	legsAt   time.Time
	opts     fabrics.Options
}

// NewKernel returns a fake kernel writing its tree below dir. Every
// change writes a new generation of the whole tree and swaps it in, so a
// reader never sees a change half made, and every directory is a new
// one (a new inode) after each change.
func NewKernel(dir string, clk clock.WithDelayedExecution) *Kernel {
	return newKernel(dir, clk, false)
}

// NewKernelInPlace returns a fake kernel that changes one tree below dir
// in place, as the kernel changes sysfs (a Tree): an attribute that
// changed is rewritten, an object that came or went is created or
// removed, and the others keep their directories and inodes, so a
// Reader's memory holds across changes. A reader that runs while a
// change is made may see it half made: it is for callers that never
// read while they change the kernel (a simulation that lets one actor
// run at a time). It costs a fraction of NewKernel's writes.
func NewKernelInPlace(dir string, clk clock.WithDelayedExecution) *Kernel {
	return newKernel(dir, clk, true)
}

func newKernel(dir string, clk clock.WithDelayedExecution, inPlace bool) *Kernel {
	k := &Kernel{dir: dir, clk: clk, targets: map[string]*Target{}, subsys: map[string]int{},
		down: map[string]bool{}, hidden: map[string]map[uint32]bool{}, noLeg: map[int]bool{},
		heads: map[string]map[uint32]fakeHead{}, lastHead: map[string]int{}, held: map[string]bool{}, unseen: map[string]map[uint32]bool{},
		inPlace: inPlace, since: clk.Now(), connects: map[int]int{}}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writeLocked()
	return k
}

// FS is the sysfs tree of the fake kernel.
func (k *Kernel) FS() sysfs.FS { return sysfs.New(filepath.Join(k.dir, "root")) }

// Generation counts the writes of the tree: it changes exactly when
// what the tree shows changes.
func (k *Kernel) Generation() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen
}

// AddTarget puts a subsystem on the fabric.
func (k *Kernel) AddTarget(t Target) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.targets[t.NQN] = &t
	k.writeLocked()
}

// Announce makes the kernel queue, from now on, the uevents the 6.1
// kernel sends for every change it makes (Uevents); TakeUevents takes
// them.
func (k *Kernel) Announce() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.announce = true
}

// TakeUevents returns the uevents queued since the last call, in order.
func (k *Kernel) TakeUevents() []uevent.Event {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.uevents
	k.uevents = nil
	return out
}

// Calls returns the operations performed so far, in order:
// "connect 127.0.0.1:4420", "delete nvme3", "rescan nvme2".
func (k *Kernel) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

// SetUnreachable makes a port drop connects (and a live controller to it
// go connecting) or come back.
func (k *Kernel) SetUnreachable(hostport string, down bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.down[hostport] = down
	for _, c := range k.ctrls {
		if net.JoinHostPort(c.host, c.port) != hostport {
			continue
		}
		if down {
			c.state = "connecting"
		} else if c.state == "connecting" {
			c.state = "live"
		}
	}
	k.writeLocked()
}

// SetNamespaceEnabled hides or shows one namespace of a target, the way
// disabling it on the target does (its head and legs vanish).
func (k *Kernel) SetNamespaceEnabled(nqn string, nsid uint32, enabled bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.hidden[nqn] == nil {
		k.hidden[nqn] = map[uint32]bool{}
	}
	if enabled && k.hidden[nqn][nsid] && k.held[nqn] {
		if k.unseen[nqn] == nil {
			k.unseen[nqn] = map[uint32]bool{}
		}
		k.unseen[nqn][nsid] = true
	}
	k.hidden[nqn][nsid] = !enabled
	k.writeLocked()
}

// HoldEvents makes the host miss the namespace-change events of target
// nqn (held) or get them again: a namespace enabled while they are held
// stays invisible until a controller of the subsystem rescans or a new
// one connects. Releasing the hold does not deliver what was missed.
func (k *Kernel) HoldEvents(nqn string, held bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held[nqn] = held
}

// Head returns the head instance and device number ("259:3") the host
// has for namespace nsid of nqn now; ok is false when it has none.
func (k *Kernel) Head(nqn string, nsid uint32) (instance int, dev string, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.heads[nqn][nsid]
	return h.instance, devOf(h), ok
}

func devOf(h fakeHead) string { return "259:" + strconv.Itoa(h.minor) }

// DropLegs makes controller instance never attach legs: a live controller
// that contributes no path.
func (k *Kernel) DropLegs(instance int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.noLeg[instance] = true
	k.writeLocked()
}

// SetState forces a controller's state ("connecting", "dead", …).
func (k *Kernel) SetState(instance int, state string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.ctrls {
		if c.instance == instance {
			c.state = state
		}
	}
	k.writeLocked()
}

// Connect implements the fabrics connect: EALREADY for a duplicate,
// ECONNREFUSED for an unreachable port or an unknown NQN.
func (k *Kernel) Connect(_ context.Context, o fabrics.Options) (fabrics.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	hp := net.JoinHostPort(o.Traddr, o.Trsvcid)
	k.calls = append(k.calls, "connect "+hp)
	k.opts = append(k.opts, o)
	t, ok := k.targets[o.NQN]
	if !ok || k.down[hp] {
		return fabrics.Result{}, fmt.Errorf("connect %s: %w: %w", hp, fabrics.ErrUnreachable, syscall.ECONNREFUSED)
	}
	if _, ok := t.Ports[hp]; !ok {
		return fabrics.Result{}, fmt.Errorf("connect %s: %w: %w", hp, fabrics.ErrUnreachable, syscall.ECONNREFUSED)
	}
	for _, c := range k.ctrls {
		if c.nqn == o.NQN && c.host == o.Traddr && c.port == o.Trsvcid {
			return fabrics.Result{}, fmt.Errorf("connect %s: %w: %w", hp, fabrics.ErrAlreadyConnected, syscall.EALREADY)
		}
	}
	now := k.clk.Now()
	c := &fakeCtrl{instance: k.next, nqn: o.NQN, host: o.Traddr, port: o.Trsvcid, state: "live", created: now, legsAt: now.Add(k.LegDelay), opts: o}
	k.connects[c.instance]++
	k.next++
	k.ctrls = append(k.ctrls, c)
	if _, ok := k.subsys[o.NQN]; !ok {
		k.subsys[o.NQN] = len(k.subsys)
	}
	delete(k.unseen, o.NQN) // a new controller scans every namespace
	if k.LegDelay > 0 {
		k.clk.AfterFunc(k.LegDelay, k.Refresh)
	}
	k.writeLocked()
	return fabrics.Result{Instance: c.instance, CntlID: c.instance + 1}, nil
}

// Disconnect deletes a controller.
func (k *Kernel) Disconnect(ctrl string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "delete "+ctrl)
	k.ctrls = slices.DeleteFunc(k.ctrls, func(c *fakeCtrl) bool { return "nvme"+strconv.Itoa(c.instance) == ctrl })
	k.writeLocked()
	return nil
}

// ConnectOptions returns the options of every connect so far, in order.
func (k *Kernel) ConnectOptions() []fabrics.Options {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.opts)
}

// GiveUp deletes every connecting controller to hostport, as the kernel
// does when their ctrl_loss_tmo runs out.
func (k *Kernel) GiveUp(hostport string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ctrls = slices.DeleteFunc(k.ctrls, func(c *fakeCtrl) bool {
		return c.state == "connecting" && net.JoinHostPort(c.host, c.port) == hostport
	})
	k.writeLocked()
}

// Reuse makes the next connect take controller instance n, as the kernel
// reuses the lowest free instance number once a controller is gone. The
// caller makes sure n is free; later connects count on from n+1.
func (k *Kernel) Reuse(n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next = n
}

// Rescan records a rescan: the subsystem's namespaces enabled while its
// events were held become visible.
func (k *Kernel) Rescan(ctrl string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "rescan "+ctrl)
	for _, c := range k.ctrls {
		if "nvme"+strconv.Itoa(c.instance) == ctrl {
			delete(k.unseen, c.nqn)
		}
	}
	k.writeLocked()
	return nil
}

// Refresh rewrites the tree at the clock's current time (legs whose delay
// has passed appear).
func (k *Kernel) Refresh() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writeLocked()
}

// topologyLocked derives the Topology the kernel publishes now.
func (k *Kernel) topologyLocked() Topology {
	now := k.clk.Now()
	var t Topology
	nqns := make([]string, 0, len(k.subsys))
	for nqn := range k.subsys {
		nqns = append(nqns, nqn)
	}
	slices.SortFunc(nqns, func(a, b string) int { return k.subsys[a] - k.subsys[b] })
	for _, nqn := range nqns {
		tgt := k.targets[nqn]
		s := Subsystem{Instance: k.subsys[nqn], NQN: nqn}
		var enabled []Namespace
		if tgt != nil {
			for _, ns := range tgt.Namespaces {
				if !k.hidden[nqn][ns.NSID] && !k.unseen[nqn][ns.NSID] {
					enabled = append(enabled, ns)
				}
			}
		}
		// A namespace head exists once some controller has scanned the
		// namespace, i.e. has a leg to it; controllers that never attach
		// legs leave the subsystem without heads (NoNamespace).
		anyLegs := false
		for _, c := range k.ctrls {
			if c.nqn != nqn {
				continue
			}
			fc := Controller{Instance: c.instance, Gen: k.connects[c.instance], State: c.state, Traddr: c.host, Trsvcid: c.port,
				SrcAddr: "127.0.0.1", Age: max(now.Sub(c.created), 0), Legs: map[int]string{}}
			if k.inPlace { // the tree's ages count back from since
				fc.Age = k.since.Sub(c.created)
			}
			if c.state != "live" {
				fc.SrcAddr = ""
			}
			c.publishOptions(&fc)
			if !now.Before(c.legsAt) && !k.noLeg[c.instance] && tgt != nil {
				for _, ns := range enabled {
					fc.Legs[ns.Head] = tgt.Ports[net.JoinHostPort(c.host, c.port)]
					anyLegs = true
				}
			}
			s.Controllers = append(s.Controllers, fc)
		}
		if anyLegs {
			s.Namespaces = enabled
		}
		k.headsLocked(&s)
		if len(s.Controllers) > 0 {
			t.Subsystems = append(t.Subsystems, s)
		}
	}
	return t
}

// headsLocked gives the namespaces the host sees in s their heads, making
// a new one (next head instance, next device number) for a namespace it
// did not have, and forgets the heads of namespaces it no longer sees.
// Legs are keyed by the target's head number until here.
func (k *Kernel) headsLocked(s *Subsystem) {
	seen := map[uint32]bool{}
	remap := map[int]int{}
	for i, ns := range s.Namespaces {
		seen[ns.NSID] = true
		if k.heads[s.NQN] == nil {
			k.heads[s.NQN] = map[uint32]fakeHead{}
		}
		h, ok := k.heads[s.NQN][ns.NSID]
		if !ok {
			h.instance = ns.Head
			if last, used := k.lastHead[s.NQN]; used && ns.Head <= last {
				h.instance = last + 1
			}
			k.lastMinor += 2
			h.minor = k.lastMinor
			k.heads[s.NQN][ns.NSID] = h
		}
		k.lastHead[s.NQN] = max(k.lastHead[s.NQN], h.instance)
		remap[ns.Head] = h.instance
		s.Namespaces[i].Head, s.Namespaces[i].Dev = h.instance, devOf(h)
	}
	for nsid := range k.heads[s.NQN] {
		if !seen[nsid] {
			delete(k.heads[s.NQN], nsid)
		}
	}
	for i, c := range s.Controllers {
		legs := make(map[int]string, len(c.Legs))
		for h, ana := range c.Legs {
			legs[remap[h]] = ana
		}
		s.Controllers[i].Legs = legs
	}
}

// writeLocked writes a fresh generation of the tree and points root at it
// with an atomic symlink swap, so a reader never sees a half-written tree.
// When the tree would show what it shows already (a Refresh before any
// leg's delay has passed, a rescan), nothing is written: the kernel
// changes nothing either, and the directories keep their identities.
func (k *Kernel) writeLocked() {
	now := k.clk.Now()
	topo := k.topologyLocked()
	ref := now
	if k.inPlace {
		ref = k.since // what the ages count back from
	}
	shown := shownKey(topo, ref)
	if k.gen > 0 && shown == k.shown {
		return
	}
	k.shown = shown
	k.gen++
	if k.announce {
		k.uevents = append(k.uevents, Uevents(k.last, topo, &k.seq)...)
	}
	k.last = topo.Clone()
	if k.inPlace {
		k.applyLocked(topo)
		return
	}
	gen := filepath.Join(k.dir, "gen-"+strconv.Itoa(k.gen))
	if err := os.MkdirAll(gen, 0o755); err != nil {
		panic(err)
	}
	if err := topo.Write(gen, now); err != nil {
		panic(err)
	}
	tmp := filepath.Join(k.dir, "root.tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		panic(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "root")); err != nil {
		panic(err)
	}
	// Keep the previous generation for readers still inside it.
	if k.gen > 2 {
		os.RemoveAll(filepath.Join(k.dir, "gen-"+strconv.Itoa(k.gen-2)))
	}
}

// shownKey is what topo written at now shows: ages become the creation
// times (the mtimes) they are written as.
func shownKey(topo Topology, now time.Time) string {
	topo = topo.Clone()
	for i := range topo.Subsystems {
		s := &topo.Subsystems[i]
		if s.Age != 0 { // zero: its oldest controller's
			s.Age = time.Duration(now.Add(-s.Age).UnixNano())
		}
		for j := range s.Controllers {
			c := &s.Controllers[j]
			c.Age = time.Duration(now.Add(-c.Age).UnixNano())
		}
	}
	return fmt.Sprintf("%+v", topo)
}

// applyLocked changes the in-place tree to show topo.
func (k *Kernel) applyLocked(topo Topology) {
	if k.tree != nil {
		if err := k.tree.Apply(topo); err != nil {
			panic(err)
		}
		return
	}
	root := filepath.Join(k.dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		panic(err)
	}
	t, err := NewTree(root, topo, k.since)
	if err != nil {
		panic(err)
	}
	k.tree = t
}

// publishOptions writes the options the controller was connected with
// into the attributes the kernel publishes them in; what a connect left
// to the kernel keeps the kernel's defaults.
func (c *fakeCtrl) publishOptions(fc *Controller) {
	o := c.opts
	itoa := func(p *int) string {
		if p == nil {
			return ""
		}
		if *p < 0 {
			return "off"
		}
		return strconv.Itoa(*p)
	}
	fc.HostNQN, fc.HostID, fc.HostTraddr, fc.HostIface = o.HostNQN, o.HostID, o.HostTraddr, o.HostIface
	fc.CtrlLossTmo, fc.ReconnectDelay, fc.FastIOFailTmo = itoa(o.CtrlLossTmo), itoa(o.ReconnectDelay), itoa(o.FastIOFailTmo)
	if o.KeepAliveTmo != nil {
		fc.KATO = *o.KeepAliveTmo
	}
	if o.NrIOQueues != nil {
		fc.QueueCount = *o.NrIOQueues + 1
	}
	if o.QueueSize != nil {
		fc.SQSize = *o.QueueSize - 1
	}
}
