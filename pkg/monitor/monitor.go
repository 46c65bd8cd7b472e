package monitor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Config tunes the loop; zero values take the defaults.
type Config struct {
	// Interval between ticks (default 3 s), plus up to Jitter·Interval of
	// random delay (default 0.2) so nodes do not tick in lockstep.
	Interval time.Duration
	Jitter   float64
	// Scope is what the loop covers: the node plugin's targets (Owned),
	// the others (Foreign, companion mode), or both (serve
	// --heal-foreign). Owned when neither is set.
	Scope Scope
}

// Scope says which targets the loop covers.
type Scope struct {
	// Owned: the targets a staged-volume record names. The loop finishes
	// their interrupted intents and keeps their staged volumes' paths.
	Owned bool
	// Foreign: the targets no record names, healed from what the
	// transports learn of them.
	Foreign bool
}

// Bound is how old, at most, a volume's entry in the model is while the
// loop runs: two ticks, jitter included. The driver refreshes a volume
// whose entry is older (docs/architecture.md).
func (c Config) Bound() time.Duration {
	c = c.withDefaults()
	return 2 * (c.Interval + time.Duration(c.Jitter*float64(c.Interval)))
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 3 * time.Second
	}
	if c.Jitter == 0 {
		c.Jitter = 0.2
	}
	if !c.Scope.Owned && !c.Scope.Foreign {
		c.Scope.Owned = true
	}
	return c
}

// Transport is one storage transport as the loop drives it
// (*nvmeheal.Transport, *iscsiheal.Transport). Plan and Finish are called
// once per tick, in that order, from the loop's goroutine; Job runs on
// the intent owner's runner with the target's lease, concurrently for
// different targets.
type Transport interface {
	// Name is the transport of the targets the loop routes to it.
	Name() volume.Transport
	// Plan reads the transport's kernel state once for the tick and says
	// which targets need a job.
	Plan(ctx context.Context, r model.Round) model.Plan
	// Job works on one target with its lease, re-reading what it needs
	// under it.
	Job(ctx context.Context, lease *intent.Lease) model.Result
	// Finish reports, once the loop read the jobs that finished, the
	// volumes of the tick's scopes as they are now, the node's conditions,
	// the defects and the verdicts decided outside jobs.
	Finish(ctx context.Context, r model.Round, jobs model.Jobs) model.Report
	// RefreshTarget reads the kernel objects of target t only and returns
	// its staged volumes among recs as they are now.
	RefreshTarget(ctx context.Context, t volume.Target, recs []volume.Record) ([]model.Volume, error)
	// TargetOf names the target of a kernel object the model does not
	// know yet (a controller, subsystem instance or session created since
	// the last read), from sysfs; ok is false for another transport's
	// object and for one that is gone.
	TargetOf(o uevent.Object) (t volume.Target, ok bool)
	// PlanTarget reads the kernel objects of target r.Target only and
	// plans it as Plan plans a tick, for that target alone: its volumes
	// as they are now, and whether it needs a job. Called from the loop's
	// goroutine, never between a Plan and its Finish.
	PlanTarget(ctx context.Context, r model.TargetRound) model.TargetPlan
	// Notice is told of every batch of kernel events, losses included,
	// before the loop decides on any of it (the loop's goroutine): a
	// transport that keeps a listing of the node between reads drops
	// what the batch may have changed.
	Notice(b uevent.Batch)
}

// Intents is what the loop needs of the node's intent owner
// (*intent.Owner): the records to plan from, and per-target jobs that run
// with the target's lease, never waiting for a busy target.
type Intents interface {
	Scan() (volume.Listing, error)
	// Generation counts the record writes: what a Scan begun at
	// generation g said still holds while it is g.
	Generation() uint64
	Get(volumeID string) (volume.Record, error)
	Go(ctx context.Context, t volume.Target, holder string, job func(context.Context, *intent.Lease)) (started bool, busy string)
}

// Reconciler finishes interrupted intents (*intent.Reconciler).
type Reconciler interface {
	// Due returns the targets with an interrupted intent to finish now.
	Due(l volume.Listing) []volume.Target
	// Reconcile finishes them under the target's lease.
	Reconcile(ctx context.Context, lease *intent.Lease) []intent.Verdict
}

// StagedDevicer returns the device the users of each staged volume hold,
// by volume ID (volume.FindStagedDevice); a volume whose staged device is
// unknown is left out. The driver reads it from the mount table.
type StagedDevicer func(recs []volume.Record) (map[string]volume.StagedDevice, error)

// Deps are the loop's seams.
type Deps struct {
	// Intents is the node's intent owner: the records (the loop keeps
	// nothing else) and the target leases every action runs under.
	Intents Intents
	// Transports are the transports built in; each target goes to the
	// one of its transport.
	Transports []Transport
	// Model is the node model the loop writes.
	Model *model.Model
	// Policy is the process's heal policy: its mode says whether the loop
	// acts (off: it reads and reports only).
	Policy *heal.Policy
	// Reconciler, when set, finishes interrupted intents of owned targets.
	Reconciler Reconciler
	Metrics    *metrics.Metrics
	Clock      clock.Clock
	// SysFS tells a removed device from a replaced one (dev/block/N).
	SysFS sysfs.FS
	// PathExists reports whether a staging path still exists (default
	// os.Stat).
	PathExists func(string) bool
	// Staged, when set, tells which device each staged volume's users
	// hold; the loop compares it with the volume's devices.
	Staged StagedDevicer
	// Filesystems, when set, reads the health of the staged filesystem
	// volumes' filesystems each tick; the loop writes each into the model
	// (the volume's fshealth.Fact), sets pathmend_volume_filesystem_state
	// and logs each change.
	Filesystems FilesystemReader
	// Events, when set, are the kernel's uevents (*uevent.Source): the
	// loop reads and plans the targets they name between ticks
	// (HandleEvents).
	Events Events
}

// Monitor is the loop: the only one of the process. Each tick it asks
// every transport to read the kernel and plan, starts one job per target
// that needs work with the target's lease (the intent owner's Go: at
// most one job per target, never waiting for a busy one), reads the jobs
// that finished, and writes what the transports report into the model:
// every volume's paths, devices, condition and notes, what its users
// hold, the node's conditions and the end of the tick. It knows no
// transport.
type Monitor struct {
	cfg  Config
	deps Deps
	tr   map[volume.Transport]Transport

	mu      sync.Mutex
	orphans map[string]bool
	done    []jobResult // finished jobs not yet read by a tick
	evDone  []jobResult // finished event jobs not yet settled
	gate    *heal.LogGate
	// replaced are the volumes whose staged-device series is set, and
	// whether replaced; paths the volumes whose path series are set.
	replaced map[string]bool
	paths    map[string]bool
	// filesystems are the states of the staged filesystems as of the
	// last tick, by volume ID: for the log of a change and the deletion
	// of an unstaged volume's series.
	filesystems map[string]fshealth.State

	// ev is what the loop keeps of kernel events between batches (its
	// goroutine only).
	ev eventState
}

// jobResult is what one job on one target did, read by a later tick.
type jobResult struct {
	model.Result
	intents []intent.Verdict
}

// New validates the configuration.
func New(cfg Config, deps Deps) (*Monitor, error) {
	if deps.Intents == nil || deps.Policy == nil || deps.Model == nil {
		return nil, errors.New("monitor: intents, policy and model are required")
	}
	if cfg.Jitter < 0 || cfg.Jitter > 1 {
		return nil, fmt.Errorf("monitor: jitter %v is outside 0..1", cfg.Jitter)
	}
	cfg = cfg.withDefaults()
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.New()
	}
	if deps.PathExists == nil {
		deps.PathExists = func(p string) bool { _, err := os.Stat(p); return err == nil }
	}
	tr := map[volume.Transport]Transport{}
	for _, t := range deps.Transports {
		if _, dup := tr[t.Name()]; dup {
			return nil, fmt.Errorf("monitor: two transports for %s", t.Name())
		}
		tr[t.Name()] = t
	}
	return &Monitor{cfg: cfg, deps: deps, tr: tr, orphans: map[string]bool{}, replaced: map[string]bool{}, paths: map[string]bool{},
		filesystems: map[string]fshealth.State{},
		gate:        heal.NewLogGate(0, deps.Clock.Now), ev: newEventState()}, nil
}

// Run ticks at once (a restarted plugin heals in its first tick) and then
// every Interval plus jitter, until ctx ends. At -v=4 each tick starts with
// a "Monitor tick" line carrying its number: a property such as "within
// two ticks" is read from the log in ticks, which stay ticks when a loaded
// node runs them late.
//
// Between ticks it answers kernel events (Deps.Events) as they come, the
// event jobs that end, and the deferred decisions that fall due
// (HandleEvents): the tick is the backstop for what no event announces.
func (m *Monitor) Run(ctx context.Context) error {
	klog.InfoS("Monitor started", "interval", m.cfg.Interval, "mode", m.deps.Policy.Mode(), "owned", m.cfg.Scope.Owned, "foreign", m.cfg.Scope.Foreign,
		"kernelEvents", m.deps.Events != nil)
	var ready <-chan struct{}
	if m.deps.Events != nil {
		ready = m.deps.Events.Ready()
	}
	for n := uint64(1); ; n++ {
		klog.V(4).InfoS("Monitor tick", "tick", n)
		m.Tick(ctx)
		wait := m.cfg.Interval + time.Duration(rand.Float64()*m.cfg.Jitter*float64(m.cfg.Interval))
		tick := m.deps.Clock.After(wait)
		var (
			due   <-chan time.Time
			armed time.Time
		)
	between:
		for {
			if next := m.NextDue(); !next.Equal(armed) {
				armed, due = next, nil
				if !next.IsZero() {
					due = m.deps.Clock.After(max(0, next.Sub(m.deps.Clock.Now())))
				}
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick:
				break between
			case <-ready:
				m.HandleEvents(ctx, m.deps.Events.Take())
			case <-m.ev.jobs:
				m.HandleEvents(ctx, uevent.Batch{})
			case <-due:
				armed, due = time.Time{}, nil
				m.HandleEvents(ctx, uevent.Batch{})
			}
		}
	}
}

// LastTick is when the last tick ended, as the model has it; zero before
// the first.
func (m *Monitor) LastTick() time.Time { return m.deps.Model.Snapshot().Ticked }

// Bound is Config.Bound of the loop's configuration.
func (m *Monitor) Bound() time.Duration { return m.cfg.Bound() }
