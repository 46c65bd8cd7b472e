package companion

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
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

// Config tunes the NVMe heal; zero values take the defaults.
type Config struct {
	// ForgetAfter: a subsystem whose controllers have all been gone this
	// long is forgotten (default 24 h).
	ForgetAfter time.Duration
	// ConnectTimeout bounds one probe and connect (default 10 s).
	ConnectTimeout time.Duration
	// BackoffBase and BackoffMax space out connects to an endpoint that
	// did not answer (defaults 3 s and 5 min).
	BackoffBase, BackoffMax time.Duration
	Actions                 Actions
	// DefectGauge sets pathmend_defects{transport="nvme-tcp"} from the
	// learned subsystems' defects each tick: in `pathmend companion`,
	// whose monitor has no records and so no NVMe defects of its own.
	// Off in the node plugin (serve --heal-foreign), whose monitor owns
	// the gauge; the foreign repairs count in pathmend_repairs_total
	// there either way.
	DefectGauge bool
}

// Defaults of Config.
const (
	DefaultForgetAfter = 24 * time.Hour
)

// Intents is what the heal needs of the node's intent owner
// (*intent.Owner): the node plugin's records, to leave its targets alone,
// and the per-target leases every actor shares.
type Intents interface {
	Scan() (volume.Listing, error)
	Go(ctx context.Context, t volume.Target, holder string, job func(context.Context, *intent.Lease)) (started bool, busy string)
}

// Prober tells whether a TCP endpoint accepts connections
// (monitor.TCPProber on a node).
type Prober interface {
	Reachable(ctx context.Context, hostport string) error
}

// Deps are the seams of the NVMe heal.
type Deps struct {
	SysFS     sysfs.FS
	Intents   Intents
	Store     *Store
	Policy    *heal.Policy
	Connector nvme.Connector
	Prober    Prober
	Clock     clock.Clock
	Metrics   *metrics.Metrics
}

// NVMe heals the NVMe/TCP subsystems other drivers connected: it learns
// every endpoint it sees live and the options its controller was
// connected with, connects again an endpoint the kernel gave up, and runs
// the teardown repairs with the learned options to reconnect. It leaves
// alone every subsystem a staged-volume record of the node plugin names.
// Tick is called once per monitor tick (it implements
// monitor.SessionHealer); it is not safe for concurrent Ticks.
type NVMe struct {
	cfg    Config
	deps   Deps
	reader *nvme.Reader

	// mu guards learned and the store's writes: the tick learns, a job
	// marks what its repair tore down.
	mu      sync.Mutex
	learned map[string]Subsystem
	blocked map[string]Unreadable // NQN → its unreadable learned file
	back    map[string]backoff    // "nqn endpoint" → connect backoff
	gate    *heal.LogGate
	// reads counts the tick's sysfs reads; connected holds, per endpoint
	// a job connected again ("nqn endpoint"), the count when the connect
	// returned: a read with a count not above it may have begun before
	// the controller existed (see learn's hold).
	reads     uint64
	connected map[string]uint64

	resMu sync.Mutex
	done  []jobResult
}

type backoff struct {
	failures int
	until    time.Time
	lastErr  string
}

// NewNVMe validates the configuration and loads what was learned before.
func NewNVMe(cfg Config, deps Deps) (*NVMe, error) {
	if deps.Intents == nil || deps.Store == nil || deps.Policy == nil || deps.Connector == nil || deps.Prober == nil || deps.SysFS.Root() == "" {
		return nil, errors.New("companion: intents, store, policy, connector, prober and sysfs are required")
	}
	if cfg.ForgetAfter <= 0 {
		cfg.ForgetAfter = DefaultForgetAfter
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 3 * time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 5 * time.Minute
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	n := &NVMe{cfg: cfg, deps: deps, reader: nvme.NewReader(deps.SysFS, nvme.ScopeAll), back: map[string]backoff{},
		gate: heal.NewLogGate(0, deps.Clock.Now)}
	if err := n.load(); err != nil {
		return nil, err
	}
	return n, nil
}

// load reads the learned files; unreadable ones block their subsystem.
func (n *NVMe) load() error {
	subs, bad, err := n.deps.Store.Load()
	if err != nil {
		return err
	}
	n.learned, n.blocked = subs, map[string]Unreadable{}
	for _, u := range bad {
		klog.ErrorS(u.Err, "Learned subsystem cannot be read; companion mode leaves the subsystem alone until it is readable or removed", "file", u.Path, "nqn", u.NQN)
		n.blocked[u.NQN] = u
	}
	return nil
}

// Learned returns a copy of what is learned now, in NQN order.
func (n *NVMe) Learned() []Subsystem {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Subsystem, 0, len(n.learned))
	for _, nqn := range sortedNQNs(n.learned) {
		out = append(out, n.learned[nqn].clone())
	}
	return out
}

// TickReport is what one Tick saw and did.
type TickReport struct {
	Events   []Event
	Defects  []heal.Defect
	Outcomes []heal.Outcome
	// Connects lists the endpoints connected, "nqn endpoint".
	Connects []string
	// Skipped lists endpoints and targets left alone and why.
	Skipped []string
}

// Tick implements monitor.SessionHealer; it ignores the records it is
// given and reads the owner's listing itself, for the unreadable files.
func (n *NVMe) Tick(ctx context.Context, _ []volume.Record, _ error) { n.Run(ctx) }

// Run is one pass: read the owner's records and sysfs, learn, persist,
// plan, and start one job per subsystem that needs work with its lease;
// then read the jobs that finished.
func (n *NVMe) Run(ctx context.Context) TickReport {
	var rep TickReport
	if n.deps.Policy.Mode() == heal.ModeOff {
		return rep
	}
	l, err := n.deps.Intents.Scan()
	if err != nil {
		klog.ErrorS(err, "Staged-volume records could not be listed; companion mode leaves every NVMe subsystem alone this tick")
		return rep
	}
	own := ownerOf(l)
	n.mu.Lock()
	n.reads++
	read := n.reads
	n.mu.Unlock()
	host, err := n.reader.Read()
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; skipping this tick's companion NVMe pass")
		return rep
	}
	seen := n.sightings(host, own)

	n.mu.Lock()
	for nqn := range n.learned {
		if own.owns(nqn) {
			// The node plugin staged a volume of it: its subsystem now.
			delete(n.learned, nqn)
			n.persist(nil, []string{nqn})
			klog.InfoS("Learned subsystem handed to the node plugin: a staged-volume record names it", "nqn", nqn)
		}
	}
	next, changed, forgotten, events := learn(n.learned, seen, n.held(read), n.cfg.ForgetAfter, n.deps.Clock.Now())
	n.learned = next
	n.persist(changed, forgotten)
	learned := make(map[string]Subsystem, len(next))
	for k, v := range next {
		learned[k] = v.clone()
	}
	n.mu.Unlock()
	rep.Events = events
	logEvents(events)

	need := map[string]bool{}
	for _, d := range nvme.Inspect(host, nil) {
		nqn := defectNQN(host, d)
		if _, ok := learned[nqn]; !ok || own.owns(nqn) {
			continue
		}
		rep.Defects = append(rep.Defects, d)
		need[nqn] = true
	}
	if n.cfg.DefectGauge && n.deps.Metrics != nil {
		counts := map[heal.Kind]int{}
		for _, d := range rep.Defects {
			counts[d.Kind]++
		}
		n.deps.Metrics.SetDefects(string(volume.TransportNVMeTCP), counts)
	}
	now := n.deps.Clock.Now()
	for _, nqn := range sortedNQNs(learned) {
		for _, e := range learned[nqn].Endpoints {
			if !e.WantsConnect() {
				continue
			}
			if ok, until, lastErr := n.ready(nqn+" "+e.String(), now); !ok {
				rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s %s: backed off until %s (%s)", nqn, e.String(), until.Format(time.TimeOnly), lastErr))
				continue
			}
			need[nqn] = true
		}
	}
	targets := make([]string, 0, len(need))
	for nqn := range need {
		targets = append(targets, nqn)
	}
	slices.Sort(targets)
	for _, nqn := range targets {
		t := volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}
		if started, busy := n.deps.Intents.Go(ctx, t, "companion", n.job); !started {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: busy: %s", t, busy))
		}
	}
	n.collect(&rep)
	return rep
}

// held returns the endpoints a job connected again after read began,
// which read may have missed, and forgets those every later read sees.
// Call with mu held.
func (n *NVMe) held(read uint64) map[string]bool {
	var out map[string]bool
	for key, at := range n.connected {
		if at < read {
			delete(n.connected, key)
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
// learn: NVMe/TCP, not discovery, not the node plugin's.
func (n *NVMe) sightings(host *nvme.Host, own owner) map[string][]Sighting {
	seen := map[string][]Sighting{}
	n.mu.Lock()
	blocked := n.blocked
	n.mu.Unlock()
	for _, c := range host.Controllers {
		if c.Transport != "tcp" || c.SubsysNQN == "" || c.SubsysNQN == nvme.DiscoveryNQN || own.owns(c.SubsysNQN) {
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
			p, err := nvme.ReadConnectParams(n.deps.SysFS, c.Name)
			if err != nil {
				klog.V(4).InfoS("Connect parameters not read; the controller's options are not updated this tick", "controller", c.Name, "err", err.Error())
			}
			s.Params, s.ParamsOK = p, err == nil
		}
		seen[c.SubsysNQN] = append(seen[c.SubsysNQN], s)
	}
	return seen
}

// persist writes the changed subsystems and deletes the forgotten ones.
// A failed write is logged; memory stays ahead and the next change is
// written again. Call with mu held.
func (n *NVMe) persist(changed, forgotten []string) {
	for _, nqn := range changed {
		if err := n.deps.Store.Put(n.learned[nqn]); err != nil {
			klog.ErrorS(err, "Learned subsystem not written", "nqn", nqn)
		}
	}
	for _, nqn := range forgotten {
		if err := n.deps.Store.Delete(nqn); err != nil {
			klog.ErrorS(err, "Learned subsystem not deleted", "nqn", nqn)
		}
	}
}

func logEvents(events []Event) {
	for _, e := range events {
		if e.Kind == Learned {
			klog.V(2).InfoS("Learned NVMe endpoint", "nqn", e.NQN, "endpoint", e.Endpoint, "reason", e.Reason)
			continue
		}
		klog.InfoS("Learned NVMe endpoint changed", "event", string(e.Kind), "nqn", e.NQN, "endpoint", e.Endpoint, "reason", e.Reason)
	}
}

// defectNQN is the subsystem NQN whose controllers a defect's teardown
// releases; "" when it releases none.
func defectNQN(h *nvme.Host, d heal.Defect) string {
	for _, p := range d.Teardown {
		if c, ok := h.Controller(nvme.ControllerName(p.Name)); ok {
			return c.SubsysNQN
		}
	}
	return ""
}

// ready reports whether key may be connected at now.
func (n *NVMe) ready(key string, now time.Time) (ok bool, until time.Time, lastErr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, found := n.back[key]
	if !found || !now.Before(b.until) {
		return true, time.Time{}, b.lastErr
	}
	return false, b.until, b.lastErr
}

// failed backs key off: base·2^(failures-1), capped.
func (n *NVMe) failed(key string, now time.Time, err error) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	b := n.back[key]
	b.failures++
	d := n.cfg.BackoffBase
	for i := 1; i < b.failures && d < n.cfg.BackoffMax; i++ {
		d *= 2
	}
	b.until, b.lastErr = now.Add(min(d, n.cfg.BackoffMax)), err.Error()
	n.back[key] = b
	return b.until
}

func (n *NVMe) succeeded(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.back, key)
}

// collect reads the finished jobs into rep and the metrics.
func (n *NVMe) collect(rep *TickReport) {
	n.resMu.Lock()
	done := n.done
	n.done = nil
	n.resMu.Unlock()
	slices.SortFunc(done, func(a, b jobResult) int { return strings.Compare(a.nqn, b.nqn) })
	for _, r := range done {
		rep.Outcomes = append(rep.Outcomes, r.outcomes...)
		rep.Connects = append(rep.Connects, r.connects...)
		rep.Skipped = append(rep.Skipped, r.skipped...)
		if n.deps.Metrics != nil {
			n.deps.Metrics.ObserveOutcomes(string(volume.TransportNVMeTCP), r.outcomes)
		}
	}
	slices.Sort(rep.Connects)
	slices.Sort(rep.Skipped)
}
