package intent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Store is the durable record store behind the owner. *volume.Store
// implements it; a simulation wraps it to crash between two writes.
type Store interface {
	// Get returns a volume's record: an error wrapping volume.ErrNotFound
	// when it has none, a *volume.RecordError when its file cannot be
	// read.
	Get(volumeID string) (volume.Record, error)
	// Put writes a record atomically.
	Put(r volume.Record) error
	// Delete removes a record; deleting a missing one succeeds.
	Delete(volumeID string) error
	// Scan reads every record file.
	Scan() (volume.Listing, error)
	// Writable checks that records can be written (the Probe RPC).
	Writable() error
	// Generation counts the Puts and Deletes made.
	Generation() uint64
}

// Observer receives what the owner counts. *metrics.Metrics implements
// it; nil counts nothing.
type Observer interface {
	// SetUnreadableRecords is the number of record files the last scan
	// could not read.
	SetUnreadableRecords(n int)
	// ObserveIntent counts one reconciliation verdict on a record in
	// state.
	ObserveIntent(state, verdict string)
}

// Defaults of Config.
const (
	// DefaultMaxJobs bounds the per-target jobs of one holder (the
	// monitor, the iSCSI session heal) running at once.
	DefaultMaxJobs = 8
)

// Config tunes an Owner.
type Config struct {
	// MaxJobs bounds the jobs of one holder Go runs at once, so that the
	// slow jobs of one actor (iSCSI logins waiting out a target) never use
	// up another's (the monitor's reconnects); DefaultMaxJobs when zero.
	MaxJobs int
}

// Deps are the owner's seams.
type Deps struct {
	// Store keeps the records. Required.
	Store Store
	// Clock stamps state changes; the real clock when nil.
	Clock clock.PassiveClock
	// Runner runs a job Go started; `go f()` when nil. A deterministic
	// simulation injects one that decides when each job runs.
	Runner func(job func())
	// Observer counts unreadable records; optional.
	Observer Observer
}

// Owner is the one owner of the node's attachment intent. It is the only
// code that reads and writes staged-volume records, and the one place
// that decides who may act on a volume and on a target right now:
//
//   - Begin admits one operation per volume (an RPC, a reconciliation);
//     a second is refused at once with a *BusyError. The volumes begun
//     and not ended are the in-flight registry.
//   - Lock, TryLock and Go hand out the lease of one target: attach,
//     detach, repair, reconnect and the iSCSI session heal of one target
//     serialize on it. Only a lease holder creates a record of the
//     target, changes a record to detaching or deletes one; CoTenants
//     under the lease are exact.
//
// An Owner keeps nothing of the records in memory: every call reads or
// writes the store, so a restarted process needs only the disk. It is
// safe for concurrent use and starts no goroutine of its own (Go runs
// jobs through the injected Runner).
type Owner struct {
	store   Store
	clock   clock.PassiveClock
	run     func(func())
	obs     Observer
	maxJobs int

	targets KeyedLocks[volume.Target]

	mu      sync.Mutex
	volumes map[string]slot
	jobs    map[string]int // holder → jobs running
}

// slot is one volume's in-flight operation.
type slot struct {
	holder string
	since  time.Time
}

// New validates cfg and deps and returns an Owner. It reads nothing.
func New(cfg Config, deps Deps) (*Owner, error) {
	if deps.Store == nil {
		return nil, errors.New("intent owner: no record store")
	}
	if cfg.MaxJobs < 0 {
		return nil, fmt.Errorf("intent owner: max jobs %d is negative", cfg.MaxJobs)
	}
	if cfg.MaxJobs == 0 {
		cfg.MaxJobs = DefaultMaxJobs
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Runner == nil {
		deps.Runner = func(f func()) { go f() }
	}
	return &Owner{store: deps.Store, clock: deps.Clock, run: deps.Runner, obs: deps.Observer,
		maxJobs: cfg.MaxJobs, volumes: map[string]slot{}, jobs: map[string]int{}}, nil
}

// BusyError refuses an operation on a volume that has one in flight.
type BusyError struct {
	VolumeID string
	// Holder is what holds the volume, e.g. "NodeStageVolume".
	Holder string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("an operation on volume %s is already in progress (%s)", e.VolumeID, e.Holder)
}

// Begin admits one operation on volumeID: it returns the end of the
// operation, to be called exactly once, or a *BusyError when another
// operation on the volume is in flight. It never blocks.
func (o *Owner) Begin(volumeID, holder string) (end func(), err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s, busy := o.volumes[volumeID]; busy {
		return nil, &BusyError{VolumeID: volumeID, Holder: s.holder}
	}
	o.volumes[volumeID] = slot{holder: holder, since: o.clock.Now()}
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			delete(o.volumes, volumeID)
			o.mu.Unlock()
		})
	}, nil
}

// InFlight reports whether an operation on volumeID is in flight, and
// which.
func (o *Owner) InFlight(volumeID string) (holder string, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.volumes[volumeID]
	return s.holder, ok
}

// Get returns a volume's record (see Store.Get). It takes no lock: the
// caller holds the volume (Begin) or only plans.
func (o *Owner) Get(volumeID string) (volume.Record, error) { return o.store.Get(volumeID) }

// Scan reads every record, for planning without a lease, and reports the
// number of unreadable files to the observer.
func (o *Owner) Scan() (volume.Listing, error) {
	l, err := o.store.Scan()
	if err == nil && o.obs != nil {
		o.obs.SetUnreadableRecords(len(l.Unreadable))
	}
	return l, err
}

// Generation counts the record writes of the store (volume.Store.Generation):
// what a Scan begun at generation g said still holds while it is g.
func (o *Owner) Generation() uint64 { return o.store.Generation() }

// Writable checks that records can be written.
func (o *Owner) Writable() error { return o.store.Writable() }

// Update writes a change of a record that neither adds nor removes a
// co-tenant of its target, so it needs no lease, only the volume
// (Begin): a change of publications (the state unchanged), or attaching
// to staged. The record must exist, readable, for the same target.
func (o *Owner) Update(rec volume.Record) error {
	cur, err := o.store.Get(rec.VolumeID)
	if err != nil {
		return fmt.Errorf("update record of volume %s: %w", rec.VolumeID, err)
	}
	if cur.Target() != rec.Target() {
		return fmt.Errorf("update record of volume %s: it is a volume of %s, not %s", rec.VolumeID, cur.Target(), rec.Target())
	}
	switch {
	case cur.State == rec.State:
	case cur.State == volume.StateAttaching && rec.State == volume.StateStaged:
	default:
		return fmt.Errorf("update record of volume %s: %s to %s needs the lease of %s", rec.VolumeID, cur.State, rec.State, rec.Target())
	}
	return o.put(cur, true, rec)
}

// put writes rec over cur (exists says whether there is one), stamping
// StateSince when the state changes.
func (o *Owner) put(cur volume.Record, exists bool, rec volume.Record) error {
	if exists && cur.State == rec.State {
		rec.StateSince = cur.StateSince
	} else {
		rec.StateSince = o.clock.Now().UTC()
	}
	return o.store.Put(rec)
}

// Lock blocks until the target's lease is free or ctx ends, and takes it
// for holder (named in "busy" notes, e.g. "NodeStageVolume pv-1").
func (o *Owner) Lock(ctx context.Context, t volume.Target, holder string) (*Lease, error) {
	if t.IsZero() {
		return nil, errors.New("lock of an unknown target")
	}
	release, err := o.targets.Lock(ctx, t, holder)
	if err != nil {
		return nil, fmt.Errorf("wait for %s: %w", t, err)
	}
	return &Lease{o: o, target: t, release: release}, nil
}

// TryLock takes the target's lease when it is free, without waiting;
// otherwise it returns nil and who holds it.
func (o *Owner) TryLock(t volume.Target, holder string) (*Lease, string) {
	release, busy := o.targets.TryLock(t, holder)
	if release == nil {
		return nil, busy
	}
	return &Lease{o: o, target: t, release: release}, ""
}

// Go starts job with the target's lease through the Runner and returns
// at once. It starts nothing, and says why, when the target is held (by
// an RPC or a job still running: at most one job per target) or MaxJobs
// jobs of the same holder run. The lease is released when job returns.
func (o *Owner) Go(ctx context.Context, t volume.Target, holder string, job func(context.Context, *Lease)) (started bool, busy string) {
	o.mu.Lock()
	if o.jobs[holder] >= o.maxJobs {
		o.mu.Unlock()
		return false, fmt.Sprintf("job limit: %d jobs of the %s running", o.maxJobs, holder)
	}
	o.jobs[holder]++
	o.mu.Unlock()
	lease, busy := o.TryLock(t, holder)
	if lease == nil {
		o.jobDone(holder)
		return false, busy
	}
	o.run(func() {
		defer o.jobDone(holder)
		defer lease.Unlock()
		job(ctx, lease)
	})
	return true, ""
}

func (o *Owner) jobDone(holder string) {
	o.mu.Lock()
	if o.jobs[holder]--; o.jobs[holder] == 0 {
		delete(o.jobs, holder)
	}
	o.mu.Unlock()
}

// Jobs is the number of jobs running, of every holder.
func (o *Owner) Jobs() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, j := range o.jobs {
		n += j
	}
	return n
}
