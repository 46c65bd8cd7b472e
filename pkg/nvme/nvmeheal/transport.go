package nvmeheal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Holders of the lease of an NVMe job, as a busy RPC is told.
const (
	HolderOwned   = "monitor"
	HolderForeign = "companion"
)

// DefaultBackoffMax caps the wait between reconnects of an endpoint that
// keeps failing (--reconnect-backoff-max).
const DefaultBackoffMax = time.Minute

// Config tunes the NVMe transport; zero values take the defaults.
type Config struct {
	// Owned heals the subsystems of staged volumes (the node plugin).
	Owned bool
	// Foreign, when set, heals the subsystems other drivers connected,
	// from what it learned (companion mode, serve --heal-foreign).
	Foreign *companion.Learner
	// Actions are the foreign scope's action flags: a reconnect or a
	// teardown repair of a learned subsystem runs only when enabled.
	Actions companion.Actions
	// ConnectTimeout bounds one probe and connect (default 10 s).
	ConnectTimeout time.Duration
	// BackoffBase and BackoffMax space out retries of an endpoint whose
	// probe got no answer or whose connect failed (defaults 3 s and
	// DefaultBackoffMax). Refusals are not backed off.
	BackoffBase, BackoffMax time.Duration
	// RecheckTimeout bounds the probe that rechecks, every tick, an
	// endpoint backed off for not answering (default 250 ms): one that
	// answers again is reconnected at once.
	RecheckTimeout time.Duration
}

// Deps are the transport's seams.
type Deps struct {
	SysFS     sysfs.FS
	Policy    *heal.Policy
	Connector nvme.Connector
	// Host is the NVMe host identity staged volumes connect with.
	Host   fabrics.HostIdentity
	Prober Prober
	Clock  clock.Clock
}

// Transport is the NVMe-oF/TCP transport as the loop drives it: each
// tick it reads sysfs once through the Reader it keeps (Plan), plans
// which subsystems need a job, runs the one job on a subsystem under its
// lease (Job), and reports the volumes as they are after the jobs
// (Finish). It keeps the one per-endpoint backoff, the endpoints that do
// not answer (Conditions) and what it aligned of the controllers'
// timeouts; nothing else, so a restarted plugin heals in its first tick.
// Plan and Finish are called by one loop, one tick at a time; Job and
// Mend may run concurrently on different subsystems.
type Transport struct {
	cfg  Config
	deps Deps
	// reader reads sysfs every tick and in every job, remembering across
	// ticks what cannot change while a kernel object lives. Its scope is
	// nvme.ScopePaths unless the foreign scope needs what a learned
	// endpoint is reconnected with (nvme.ScopeAll).
	reader *nvme.Reader
	back   *heal.Backoff
	reach  *reachability
	gate   *heal.LogGate

	alignMu sync.Mutex
	align   alignment

	// round is the tick between Plan and Finish (the loop's goroutine).
	round round

	mu sync.Mutex
	// endpoints counts the distinct endpoints staged volumes list, per
	// subsystem NQN, as of the last tick.
	endpoints map[string]int

	// last is what Finish reported of each staged volume and the grades
	// it was built from: a volume whose paths and device did not change
	// is reported as it was, without building it again (the loop's
	// goroutine only). buf is the grading's scratch space.
	last map[string]lastVolume
	gen  uint64
	buf  []nvme.EndpointPath
}

// lastVolume is a staged volume as Finish last reported it, in tick gen.
type lastVolume struct {
	v      model.Volume
	grades []nvme.EndpointPath
	gen    uint64
}

// round is what Plan leaves for Finish.
type round struct {
	host    *nvme.Host
	idx     *nvme.Index
	all     []nvme.Expectation
	staged  []nvme.Expectation
	byID    map[string]*volume.Record
	notes   map[string][]string
	learned map[string]companion.Subsystem
	counts  map[heal.Kind]int
	work    map[volume.Target]bool
}

// New validates the configuration.
func New(cfg Config, deps Deps) (*Transport, error) {
	if deps.Policy == nil || deps.Connector == nil || deps.Prober == nil || deps.SysFS.Root() == "" {
		return nil, errors.New("nvme transport: policy, connector, prober and sysfs are required")
	}
	if cfg.Owned && (deps.Host.NQN == "" || deps.Host.ID == "") {
		return nil, errors.New("nvme transport: the host NQN and ID are required to heal staged volumes")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 3 * time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.RecheckTimeout <= 0 {
		cfg.RecheckTimeout = 250 * time.Millisecond
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	scope := nvme.ScopePaths
	if cfg.Foreign != nil {
		scope = nvme.ScopeAll
	}
	return &Transport{cfg: cfg, deps: deps, reader: nvme.NewReader(deps.SysFS, scope),
		back: heal.NewBackoff(cfg.BackoffBase, cfg.BackoffMax), reach: newReachability(),
		gate: heal.NewLogGate(0, deps.Clock.Now), align: newAlignment()}, nil
}

// Name is the transport the loop routes NVMe/TCP targets to.
func (t *Transport) Name() volume.Transport { return volume.TransportNVMeTCP }

// Reader is the reader the transport keeps (its counts are the tick's
// cost).
func (t *Transport) Reader() *nvme.Reader { return t.reader }

func nvmeTarget(nqn string) volume.Target {
	return volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}
}

// expectations splits the NVMe records of recs: every one (co-tenants,
// Inspect), and the staged ones with their records.
func expectations(recs []volume.Record) (all, staged []nvme.Expectation, byID map[string]*volume.Record) {
	byID = make(map[string]*volume.Record, len(recs))
	all = make([]nvme.Expectation, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		if e, ok := nvme.ExpectationFromRecord(*r); ok {
			all = append(all, e)
			if r.State == volume.StateStaged {
				byID[r.VolumeID] = r
			}
		}
	}
	if len(byID) == len(all) {
		return all, all, byID // every one staged, as on a steady node
	}
	staged = make([]nvme.Expectation, 0, len(byID))
	for _, e := range all {
		if byID[e.VolumeID] != nil {
			staged = append(staged, e)
		}
	}
	return all, staged, byID
}

// Plan reads sysfs once and plans which subsystems need a job: in the
// owned scope a defect on a staged volume's subsystem, a missing path of
// a staged volume that is not backed off (or is, for not answering: the
// job rechecks it), a controller whose timeouts are not aligned; in the
// foreign scope, after learning from the read, a defect of a learned
// subsystem or a learned endpoint to connect again. Only subsystems a
// record names are the owned scope's, only the others the foreign
// scope's. Endpoints backed off after a failed connect are reported
// here, with no job.
func (t *Transport) Plan(ctx context.Context, r model.Round) model.Plan {
	t.round = round{notes: map[string][]string{}, work: map[volume.Target]bool{}}
	var p model.Plan
	if t.deps.Policy.Mode() == heal.ModeOff {
		return p
	}
	exps, staged, byID := []nvme.Expectation(nil), []nvme.Expectation(nil), map[string]*volume.Record(nil)
	if r.Owned {
		exps, staged, byID = expectations(r.Listing.Records)
	}
	t.round.all, t.round.staged, t.round.byID = exps, staged, byID
	foreign := t.cfg.Foreign != nil && r.Foreign
	if foreign && r.ListErr != nil {
		klog.ErrorS(r.ListErr, "Staged-volume records could not be listed; companion mode leaves every NVMe subsystem alone this tick")
		foreign = false
	}
	if len(exps) == 0 && !foreign {
		return p
	}
	var read uint64
	if foreign {
		read = t.cfg.Foreign.BeginRead()
	}
	host, err := t.reader.Read()
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; skipping this tick's NVMe passes")
		return p
	}
	t.round.host, t.round.idx = host, nvme.NewIndex(host)
	holders := map[volume.Target]string{}
	if len(exps) > 0 {
		p.Defects = nvme.Inspect(host, exps)
		t.round.counts = countKinds(p.Defects)
		for _, d := range p.Defects {
			if nqn := nvme.TeardownNQN(host, d); nqn != "" {
				holders[nvmeTarget(nqn)] = HolderOwned
			}
		}
		skipped, _ := t.planReconnects(t.round.idx, staged, holders, t.round.notes)
		p.Skipped = append(p.Skipped, skipped...)
		t.planAlign(t.round.idx, staged, byID, holders, true)
		// Only targets some record names are the owned scope's: the
		// kernel objects of targets pathmend did not stage are not its to
		// repair.
		for tg := range holders {
			if len(r.Listing.Of(tg).Records) == 0 {
				delete(holders, tg)
			}
		}
	}
	if foreign {
		fd := t.planForeign(host, r, read, holders, &p)
		if !r.Owned {
			t.round.counts = countKinds(fd)
		}
		p.Defects = append(p.Defects, fd...)
	}
	targets := make([]volume.Target, 0, len(holders))
	for tg := range holders {
		targets = append(targets, tg)
	}
	slices.SortFunc(targets, volume.Target.Compare)
	for _, tg := range targets {
		p.Work = append(p.Work, model.Work{Target: tg, Holder: holders[tg]})
		t.round.work[tg] = true
	}
	slices.Sort(p.Skipped)
	return p
}

func countKinds(ds []heal.Defect) map[heal.Kind]int {
	counts := map[heal.Kind]int{}
	for _, d := range ds {
		counts[d.Kind]++
	}
	return counts
}

// planReconnects notes, for every staged volume, the missing endpoints a
// job would reconnect; a target with one that is not backed off, or that
// is backed off for not answering (the job rechecks it with a probe
// bounded by RecheckTimeout), needs a job. Endpoints backed off after a
// failed connect are returned (and noted on their volumes in notes),
// with no job and no lock, and next is the end of the earliest of their
// backoffs (zero when none is backed off).
func (t *Transport) planReconnects(idx *nvme.Index, staged []nvme.Expectation, holders map[volume.Target]string, notes map[string][]string) (skipped []string, next time.Time) {
	now := t.deps.Clock.Now()
	for _, e := range staged {
		tg := nvmeTarget(e.NQN)
		for _, ep := range e.Endpoints {
			if idx.Covered(e.NQN, ep) {
				continue
			}
			if t.deps.Policy.Mode() != heal.ModeRepair {
				holders[tg] = HolderOwned
				continue
			}
			if ok, until, lastErr, recheck := t.back.Ready(e.NQN+" "+ep.String(), now); !ok {
				if recheck {
					// Silent when last tried: the job rechecks it with a
					// short probe, so it is reconnected once it answers.
					holders[tg] = HolderOwned
					continue
				}
				s := fmt.Sprintf("%s: backed off until %s (%s)", ep, until.Format("15:04:05"), lastErr)
				skipped = append(skipped, s)
				notes[e.VolumeID] = append(notes[e.VolumeID], "reconnect "+s)
				if next.IsZero() || until.Before(next) {
					next = until
				}
				continue
			}
			holders[tg] = HolderOwned
		}
	}
	return skipped, next
}

// planForeign learns from host and plans the learned subsystems the node
// plugin does not own: a defect, or an endpoint to connect again that is
// not backed off. It returns their defects.
func (t *Transport) planForeign(host *nvme.Host, r model.Round, read uint64, holders map[volume.Target]string, p *model.Plan) []heal.Defect {
	own := companion.OwnerOf(r.Listing)
	learned, events := t.cfg.Foreign.Learn(host, own, read, t.deps.Clock.Now())
	companion.LogEvents(events)
	for _, e := range events {
		p.Events = append(p.Events, e.String())
	}
	t.round.learned = learned
	var defects []heal.Defect
	for _, d := range nvme.Inspect(host, nil) {
		nqn := nvme.TeardownNQN(host, d)
		if _, ok := learned[nqn]; !ok || own.Owns(nqn) {
			continue
		}
		defects = append(defects, d)
		if _, ok := holders[nvmeTarget(nqn)]; !ok {
			holders[nvmeTarget(nqn)] = HolderForeign
		}
	}
	now := t.deps.Clock.Now()
	for _, nqn := range sortedKeys(learned) {
		for _, e := range learned[nqn].Endpoints {
			if !e.WantsConnect() {
				continue
			}
			if ok, until, lastErr, recheck := t.back.Ready(nqn+" "+e.String(), now); !ok && !recheck {
				p.Skipped = append(p.Skipped, fmt.Sprintf("%s %s: backed off until %s (%s)", nqn, e.String(), until.Format(time.TimeOnly), lastErr))
				continue
			}
			if _, ok := holders[nvmeTarget(nqn)]; !ok {
				holders[nvmeTarget(nqn)] = HolderForeign
			}
		}
	}
	return defects
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Finish reads, after the tick's jobs, what they changed (sysfs again
// only when one changed the kernel: a healthy tick reads it once) and
// reports every volume of the tick's scopes as it is now, with what the
// tick decided about it (notes), the node's conditions (targets and
// endpoints that do not answer) and the defect counts.
func (t *Transport) Finish(ctx context.Context, r model.Round, jobs model.Jobs) model.Report {
	rep := model.Report{Defects: t.round.counts}
	if t.deps.Policy.Mode() == heal.ModeOff {
		t.forget()
		return rep
	}
	notes := t.round.notes
	changed := false
	for _, j := range jobs.Done {
		for id, n := range j.Notes {
			notes[id] = append(notes[id], n...)
		}
		changed = changed || j.Changed
	}
	for tg, busy := range jobs.Busy {
		for _, rec := range r.Listing.Of(tg).Records {
			notes[rec.VolumeID] = append(notes[rec.VolumeID], "repair and reconnect deferred: "+tg.String()+" busy: "+busy)
		}
	}
	idx := t.round.idx
	if (idx == nil || changed) && (len(t.round.staged) > 0 || t.round.learned != nil) {
		if h, err := t.reader.Read(); err == nil {
			idx = nvme.NewIndex(h)
		}
	}
	if t.back.Len() > 0 {
		// Forget the backoff of endpoints nothing lists any more.
		inUse := map[string]bool{}
		for _, e := range t.round.all {
			for _, ep := range e.Endpoints {
				inUse[e.NQN+" "+ep.String()] = true
			}
		}
		for nqn, s := range t.round.learned {
			for _, e := range s.Endpoints {
				inUse[nqn+" "+e.String()] = true
			}
		}
		t.back.Prune(func(k string) bool { return inUse[k] })
	}
	if idx == nil || len(t.round.staged) == 0 {
		t.forgetEndpoints()
	}
	if idx == nil {
		return rep
	}
	if t.last == nil {
		t.last = make(map[string]lastVolume, len(t.round.staged))
	}
	t.gen++
	rep.Volumes = make([]model.Volume, 0, len(t.round.staged)+len(t.round.learned))
	for _, e := range t.round.staged {
		v := t.tickVolume(idx, e)
		v.Notes = notes[e.VolumeID]
		rep.Volumes = append(rep.Volumes, v)
	}
	for id, l := range t.last {
		if l.gen != t.gen {
			delete(t.last, id)
		}
	}
	for _, nqn := range sortedKeys(t.round.learned) {
		rep.Volumes = append(rep.Volumes, foreignVolume(idx, t.round.learned[nqn]))
	}
	if len(t.round.staged) > 0 {
		t.trackEndpoints(idx, t.round.staged)
	}
	rep.Node = t.Conditions()
	return rep
}

// forget drops what the transport tracks of endpoints: healing is off.
func (t *Transport) forget() {
	t.forgetEndpoints()
	t.back.Prune(func(string) bool { return false })
}

func (t *Transport) forgetEndpoints() {
	t.mu.Lock()
	t.endpoints = nil
	t.mu.Unlock()
	t.reach.prune(nil)
}

// RefreshTarget reads the objects of subsystem tg only
// (nvme.Reader.ReadTarget) and returns its staged volumes among recs as
// they are now.
func (t *Transport) RefreshTarget(ctx context.Context, tg volume.Target, recs []volume.Record) ([]model.Volume, error) {
	_, staged, _ := expectations(recs)
	var mine []nvme.Expectation
	for _, e := range staged {
		if e.NQN == tg.Name {
			mine = append(mine, e)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	host, err := t.reader.ReadTarget(tg.Name)
	if err != nil {
		return nil, err
	}
	idx := nvme.NewIndex(host)
	out := make([]model.Volume, 0, len(mine))
	for _, e := range mine {
		out = append(out, t.volumeOf(idx, e))
	}
	return out, nil
}

// tickVolume is volumeOf for Finish: the volume as the last tick reported
// it when its grades and its device are the same, so that a steady tick
// builds nothing; it records what it reports in t.last.
func (t *Transport) tickVolume(idx *nvme.Index, e nvme.Expectation) model.Volume {
	pr := idx.ReportPathsInto(e, t.buf)
	t.buf = pr.Endpoints[:0]
	l, ok := t.last[e.VolumeID]
	if !ok || !slices.Equal(l.grades, pr.Endpoints) || !sameHead(idx, e, l.v.Devices) {
		l.v, l.grades = t.build(idx, e, pr), slices.Clone(pr.Endpoints)
	}
	l.gen = t.gen
	t.last[e.VolumeID] = l
	return l.v
}

// sameHead reports whether the namespace of e in idx is the one multipath
// head devs holds, with the same number. (Without a head — multipath off
// — the devices are read again.)
func sameHead(idx *nvme.Index, e nvme.Expectation, devs []volume.BlockDevice) bool {
	loc, err := idx.Locate(e)
	if err != nil || loc.Namespace.Head == "" || loc.Namespace.Dev.IsZero() || len(devs) != 1 {
		return false
	}
	return devs[0].Name == string(loc.Namespace.Head) && devs[0].Number == loc.Namespace.Dev
}

// volumeOf is the model's entry of staged volume e in idx: its expected
// paths graded, its condition and the devices its namespace has now.
func (t *Transport) volumeOf(idx *nvme.Index, e nvme.Expectation) model.Volume {
	return t.build(idx, e, idx.ReportPaths(e))
}

// build is the entry of e from its grades pr.
func (t *Transport) build(idx *nvme.Index, e nvme.Expectation, pr nvme.PathReport) model.Volume {
	c := nvme.ConditionOf(pr)
	c.Devices = nvme.CurrentDevices(t.deps.SysFS, idx.Host(), e)
	v := model.Volume{ID: e.VolumeID, Target: nvmeTarget(e.NQN), Scope: model.Owned, Condition: c, Devices: c.Devices,
		Paths: make([]model.Path, 0, len(pr.Endpoints))}
	for _, p := range pr.Endpoints {
		mp := model.Path{Endpoint: p.Endpoint.String(), Object: string(p.Controller), Optimized: p.Optimized, Detail: p.Problem}
		switch {
		case p.Live:
			mp.State = model.PathLive
		case p.Controller != "":
			mp.State = model.PathDown
		default:
			mp.State = model.PathAbsent
		}
		v.Paths = append(v.Paths, mp)
	}
	return v
}

// foreignVolume is the model's entry of a learned subsystem: each learned
// endpoint, live when a live controller goes there.
func foreignVolume(idx *nvme.Index, s companion.Subsystem) model.Volume {
	v := model.Volume{ID: s.NQN, Target: nvmeTarget(s.NQN), Scope: model.Foreign}
	live := 0
	var problems []string
	for _, e := range s.Endpoints {
		p := model.Path{Endpoint: net.JoinHostPort(e.Traddr, e.Trsvcid), State: model.PathAbsent, Detail: "not connected"}
		for _, c := range idx.ControllersOf(s.NQN) {
			if c.State.Deleting() || !companion.GoesTo(c, e.Endpoint) {
				continue
			}
			p.Object = string(c.Name)
			if c.State == nvme.StateLive {
				p.State, p.Optimized, p.Detail = model.PathLive, true, ""
				break
			}
			p.State, p.Detail = model.PathDown, string(c.Name)+" "+string(c.State)
		}
		if p.State == model.PathLive {
			live++
		} else {
			problems = append(problems, p.Endpoint+": "+p.Detail)
		}
		v.Paths = append(v.Paths, p)
	}
	v.Condition = nvme.ConditionOf(nvme.PathReport{Expected: len(s.Endpoints), Live: live, Problems: problems})
	for _, sub := range idx.SubsystemsOf(s.NQN) {
		for _, ns := range sub.Namespaces {
			for _, d := range ns.Devices() {
				v.Devices = append(v.Devices, volume.BlockDevice{Name: string(d), Number: ns.Dev})
			}
		}
	}
	return v
}
