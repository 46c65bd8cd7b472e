package companion

import (
	"errors"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Actions are the action kinds companion mode may take, each enabled on
// its own. With --heal=repair and none enabled it decides and reports
// like observe mode (class action_disabled).
type Actions struct {
	// NVMeReconnect connects again an endpoint the kernel gave up.
	NVMeReconnect bool
	// NVMeRepairs runs the teardown repairs (NoNamespace,
	// ControllerNotContributing, AmbiguousHead, StaleEndpoint) and
	// connects again what they tore down.
	NVMeRepairs bool
	// ISCSIRelogin logs out and in one stuck session whose LUNs all have
	// another live path.
	ISCSIRelogin bool
	// ISCSIRestart restarts iscsid for a stuck session (rate-limited).
	ISCSIRestart bool
}

// DefaultForgetAfter: a learned subsystem whose controllers have all been
// gone this long is forgotten.
const DefaultForgetAfter = 24 * time.Hour

// Learner keeps what the foreign scope expects of the NVMe/TCP subsystems
// other drivers connected: every endpoint seen and the options its
// controller was connected with, learned from the loop's reads and kept
// in the state dir's Store. It has no loop of its own: the NVMe
// transport calls Learn with each tick's read, and asks it what to
// connect again. It is safe for concurrent use (a tick learns while a
// job marks what its repair tore down).
type Learner struct {
	sys         sysfs.FS
	store       *Store
	forgetAfter time.Duration

	mu      sync.Mutex
	learned map[string]Subsystem
	blocked map[string]Unreadable // NQN → its unreadable learned file
	// reads counts the reads learned from; connected holds, per endpoint
	// connected again ("nqn endpoint"), the count when the connect
	// returned: a read with a count not above it may have begun before
	// the controller existed (see learn's hold).
	reads     uint64
	connected map[string]uint64
}

// NewLearner loads what was learned before from store. sys is read for
// the connect parameters of each foreign controller (ReadConnectParams).
func NewLearner(sys sysfs.FS, store *Store, forgetAfter time.Duration) (*Learner, error) {
	if store == nil || sys.Root() == "" {
		return nil, errors.New("companion: sysfs and store are required")
	}
	if forgetAfter <= 0 {
		forgetAfter = DefaultForgetAfter
	}
	l := &Learner{sys: sys, store: store, forgetAfter: forgetAfter}
	subs, bad, err := store.Load()
	if err != nil {
		return nil, err
	}
	l.learned, l.blocked = subs, map[string]Unreadable{}
	for _, u := range bad {
		klog.ErrorS(u.Err, "Learned subsystem cannot be read; companion mode leaves the subsystem alone until it is readable or removed", "file", u.Path, "nqn", u.NQN)
		l.blocked[u.NQN] = u
	}
	return l, nil
}

// Learned returns a copy of what is learned now, in NQN order.
func (l *Learner) Learned() []Subsystem {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Subsystem, 0, len(l.learned))
	for _, nqn := range sortedNQNs(l.learned) {
		out = append(out, l.learned[nqn].clone())
	}
	return out
}

// Subsystem returns a copy of the learned subsystem nqn.
func (l *Learner) Subsystem(nqn string) (Subsystem, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.learned[nqn]
	return s.clone(), ok
}

// BeginRead numbers a read of the node that is about to begin; pass the
// number to Learn.
func (l *Learner) BeginRead() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads++
	return l.reads
}

// Learn applies host, the read numbered read, to what is learned: the
// subsystems a staged-volume record of the node plugin now names are
// handed to it (forgotten here), every other NVMe/TCP subsystem is
// learned (Learn's rule), and what changed is written to the store. It
// returns a copy of what is learned after, and what changed.
func (l *Learner) Learn(host *nvme.Host, own Owner, read uint64, now time.Time) (map[string]Subsystem, []Event) {
	seen := l.sightings(host, own)
	l.mu.Lock()
	defer l.mu.Unlock()
	for nqn := range l.learned {
		if own.Owns(nqn) {
			// The node plugin staged a volume of it: its subsystem now.
			delete(l.learned, nqn)
			l.persist(nil, []string{nqn})
			klog.InfoS("Learned subsystem handed to the node plugin: a staged-volume record names it", "nqn", nqn)
		}
	}
	next, changed, forgotten, events := learn(l.learned, seen, l.held(read), l.forgetAfter, now)
	l.learned = next
	l.persist(changed, forgotten)
	out := make(map[string]Subsystem, len(next))
	for k, v := range next {
		out[k] = v.clone()
	}
	return out, events
}

// LearnTarget is Learn for one subsystem, nqn, from host, a read of that
// subsystem's objects only (nvme.Reader.ReadTarget), numbered read: a
// kernel event named it. What is learned of every other subsystem is
// left as it is. own is the node plugin's records of nqn: when it owns
// nqn, what was learned of it is handed over (forgotten here) and ok is
// false. It returns a copy of the subsystem as learned after (ok false
// when it is not, or no longer, learned), and what changed.
func (l *Learner) LearnTarget(host *nvme.Host, nqn string, own Owner, read uint64, now time.Time) (sub Subsystem, ok bool, events []Event) {
	seen := l.sightings(host, own)
	only := map[string][]Sighting{}
	if s, ok := seen[nqn]; ok {
		only[nqn] = s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := map[string]Subsystem{}
	if s, ok := l.learned[nqn]; ok {
		if own.Owns(nqn) {
			delete(l.learned, nqn)
			l.persist(nil, []string{nqn})
			klog.InfoS("Learned subsystem handed to the node plugin: a staged-volume record names it", "nqn", nqn)
			return Subsystem{}, false, nil
		}
		prev[nqn] = s
	}
	if own.Owns(nqn) {
		return Subsystem{}, false, nil
	}
	next, changed, forgotten, events := learn(prev, only, l.held(read), l.forgetAfter, now)
	if s, ok := next[nqn]; ok {
		l.learned[nqn] = s
	} else {
		delete(l.learned, nqn)
	}
	l.persist(changed, forgotten)
	s, ok := next[nqn]
	return s.clone(), ok, events
}

// held returns the endpoints connected again after read began, which
// read may have missed, and forgets those every later read sees. Call
// with mu held.
func (l *Learner) held(read uint64) map[string]bool {
	var out map[string]bool
	for key, at := range l.connected {
		if at < read {
			delete(l.connected, key)
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[key] = true
	}
	return out
}

// sightings lists the controllers of every subsystem companion mode may
// learn: NVMe/TCP, not discovery, not the node plugin's, not blocked.
func (l *Learner) sightings(host *nvme.Host, own Owner) map[string][]Sighting {
	seen := map[string][]Sighting{}
	l.mu.Lock()
	blocked := l.blocked
	l.mu.Unlock()
	for _, c := range host.Controllers {
		if c.Transport != "tcp" || c.SubsysNQN == "" || c.SubsysNQN == nvme.DiscoveryNQN || own.Owns(c.SubsysNQN) {
			continue
		}
		if s, ok := host.Subsystem(c.Subsystem); ok && s.Discovery() {
			continue
		}
		if _, ok := blocked[c.SubsysNQN]; ok {
			continue
		}
		s := Sighting{Controller: c}
		if !c.State.Deleting() {
			p, err := nvme.ReadConnectParams(l.sys, c.Name)
			if err != nil {
				klog.V(4).InfoS("Connect parameters not read; the controller's options are not updated this tick", "controller", c.Name, "err", err.Error())
			}
			s.Params, s.ParamsOK = p, err == nil
		}
		seen[c.SubsysNQN] = append(seen[c.SubsysNQN], s)
	}
	return seen
}

// MarkTornDown marks the learned endpoints of nqn a repair tore down
// (torn, by Endpoint.String), so a later tick connects them again even
// if this job's connect fails, and returns the subsystem's endpoints.
func (l *Learner) MarkTornDown(nqn string, torn map[string]bool) []Endpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	sub, ok := l.learned[nqn]
	if !ok {
		return nil
	}
	if len(torn) > 0 {
		sub = sub.clone()
		for i := range sub.Endpoints {
			if torn[sub.Endpoints[i].String()] {
				sub.Endpoints[i].TornDown = true
			}
		}
		l.learned[nqn] = sub
		l.persist([]string{nqn}, nil)
	}
	return slices.Clone(sub.Endpoints)
}

// Reconnected records that endpoint ep of nqn has a live controller
// again, name, which a connect just created: the kernel answers a
// connect once the controller is live. Without it the endpoint would stay
// given up until a tick read the new controller, and a controller someone
// disconnected before that tick would read as given up again, and be
// connected again, instead of as a disconnect.
func (l *Learner) Reconnected(nqn string, ep nvme.Endpoint, name nvme.ControllerName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sub, ok := l.learned[nqn]
	if !ok {
		return
	}
	sub = sub.clone()
	e := sub.endpoint(ep)
	if e == nil {
		return
	}
	e.Controller, e.GoneSince, e.TornDown, e.LastState = name, time.Time{}, false, nvme.StateLive
	l.learned[nqn] = sub
	l.persist([]string{nqn}, nil)
	if l.connected == nil {
		l.connected = map[string]uint64{}
	}
	l.connected[nqn+" "+ep.String()] = l.reads
}

// persist writes the changed subsystems and deletes the forgotten ones.
// A failed write is logged; memory stays ahead and the next change is
// written again. Call with mu held.
func (l *Learner) persist(changed, forgotten []string) {
	for _, nqn := range changed {
		if err := l.store.Put(l.learned[nqn]); err != nil {
			klog.ErrorS(err, "Learned subsystem not written", "nqn", nqn)
		}
	}
	for _, nqn := range forgotten {
		if err := l.store.Delete(nqn); err != nil {
			klog.ErrorS(err, "Learned subsystem not deleted", "nqn", nqn)
		}
	}
}

// Owner answers, from one listing of the node plugin's records, whether
// a target is the node plugin's. One owner per kernel object: a target
// that any staged-volume record names, in any state, is the plugin's; so
// is a target an unreadable record file may belong to, and every target
// while a record file names no target at all (fail closed). Everything
// else on the node is companion mode's.
type Owner struct {
	named map[volume.Target]bool
	all   bool
}

// OwnerOf reads l.
func OwnerOf(l volume.Listing) Owner {
	o := Owner{named: map[volume.Target]bool{}}
	for _, r := range l.Records {
		o.named[r.Target()] = true
	}
	for _, u := range l.Unreadable {
		if u.Target.IsZero() {
			o.all = true
		}
		o.named[u.Target] = true
	}
	return o
}

// Owns reports whether the NVMe subsystem nqn is the node plugin's.
func (o Owner) Owns(nqn string) bool {
	return o.all || o.named[volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}]
}

// Why says why a target is the plugin's, for the verdict line.
func (o Owner) Why() string {
	if o.all {
		return "a staged-volume record file names no target (it cannot be read); every target may be the node plugin's"
	}
	return "a staged-volume record of the node plugin names the target"
}

// LogEvents writes one line per learning event: level 2 for an endpoint
// learned, level 0 for the others (a give-up, a disconnect, a forget).
func LogEvents(events []Event) {
	for _, e := range events {
		if e.Kind == Learned {
			klog.V(2).InfoS("Learned NVMe endpoint", "nqn", e.NQN, "endpoint", e.Endpoint, "reason", e.Reason)
			continue
		}
		klog.InfoS("Learned NVMe endpoint changed", "event", string(e.Kind), "nqn", e.NQN, "endpoint", e.Endpoint, "reason", e.Reason)
	}
}

// String renders an event for a report: "disconnected nqn endpoint: why".
func (e Event) String() string {
	s := string(e.Kind) + " " + e.NQN
	if e.Endpoint != "" {
		s += " " + e.Endpoint
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}
