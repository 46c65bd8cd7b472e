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

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Config tunes the monitor; zero values take the defaults.
type Config struct {
	// Interval between ticks (default 3 s), plus up to Jitter·Interval of
	// random delay (default 0.2) so nodes do not tick in lockstep.
	Interval time.Duration
	Jitter   float64
	// ConnectTimeout bounds one connect (default 10 s).
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

// DefaultBackoffMax caps the wait between reconnects of an endpoint that
// keeps failing (--reconnect-backoff-max).
const DefaultBackoffMax = time.Minute

// SessionHealer is the iSCSI session heal, run once per tick after the
// NVMe passes. recordsErr is the error of listing the staged volumes when
// some could not be read (records holds the readable ones).
type SessionHealer interface {
	Tick(ctx context.Context, records []volume.Record, recordsErr error)
}

// Intents is what the monitor needs of the node's intent owner
// (*intent.Owner): the records to plan from, and per-target jobs that run
// with the target's lease, never waiting for a busy target.
type Intents interface {
	Scan() (volume.Listing, error)
	Go(ctx context.Context, t volume.Target, holder string, job func(context.Context, *intent.Lease)) (started bool, busy string)
}

// Reconciler finishes interrupted intents (*intent.Reconciler).
type Reconciler interface {
	// Due returns the targets with an interrupted intent to finish now.
	Due(l volume.Listing) []volume.Target
	// Reconcile finishes them under the target's lease.
	Reconcile(ctx context.Context, lease *intent.Lease) []intent.Verdict
}

// Deps are the monitor's seams.
type Deps struct {
	SysFS sysfs.FS
	// Intents is the node's intent owner: the records (the monitor keeps
	// nothing else) and the target leases every action runs under.
	Intents Intents
	// Reconciler, when set, finishes interrupted intents on each tick.
	Reconciler Reconciler
	Policy     *heal.Policy
	Connector  nvme.Connector
	Host       fabrics.HostIdentity
	Prober     Prober
	Clock      clock.Clock
	Metrics    *metrics.Metrics
	// Sessions is the iSCSI heal; nil when iSCSI is not built in.
	Sessions SessionHealer
	// PathExists reports whether a staging path still exists (default
	// os.Stat).
	PathExists func(string) bool
	// Staged, when set, tells which device each staged volume's users
	// hold (the driver knows the mounts); the tick compares it with the
	// volume's devices for pathmend_volume_staged_device_replaced.
	Staged StagedDevicer
}

// StagedDevicer returns the device the users of each staged volume hold,
// by volume ID (volume.FindStagedDevice); a volume whose staged device is
// unknown is left out. *driver.Driver implements it.
type StagedDevicer interface {
	StagedDevices(recs []volume.Record) (map[string]volume.StagedDevice, error)
}

// SessionDevices is a SessionHealer that also tells, from its tick's read,
// the block devices staged iSCSI volumes' LUNs have now, by volume ID.
type SessionDevices interface {
	CurrentDevices(recs []volume.Record) map[string][]volume.BlockDevice
}

// Monitor keeps every path of every staged volume healthy: each tick it
// reads the records and sysfs once and plans, unlocked, which targets
// need work; each such target gets one job with its lease (the intent
// owner's Go: at most one job per target, bounded, never waiting for a
// busy target). Under the lease the job re-reads the target's records and
// sysfs and decides again: it finishes interrupted intents, repairs what
// diagnosis finds through the policy, and only then reconnects the missing
// paths of staged volumes — optimized first. Repair runs first so that
// whatever it tears down is reconnected in the same job, and reconcile
// never races a controller it just made. The tick does not wait for its
// jobs: their outcomes are read by the tick that finds them done (with a
// synchronous runner, the same tick).
type Monitor struct {
	cfg   Config
	deps  Deps
	back  *backoff
	reach *reachability
	// nvme reads sysfs every tick (and in every job: it is safe for
	// concurrent use), remembering across ticks what cannot change while
	// a kernel object lives.
	nvme *nvme.Reader

	mu       sync.Mutex
	status   map[string]VolumeStatus
	orphans  map[string]bool
	lastTick time.Time
	done     []jobResult // finished jobs not yet read by a tick
	gate     *heal.LogGate
	// replaced are the volumes whose staged device series is set, so
	// that an unstaged volume's series is deleted.
	replaced map[string]bool
	// align is what jobs aligned of the staged volumes' timeouts;
	// alignMu guards it (the tick plans from it, jobs write it).
	alignMu sync.Mutex
	align   alignment
	// endpoints counts the distinct endpoints staged volumes list, per
	// subsystem NQN, as of the last tick.
	endpoints map[string]int
}

// VolumeStatus is what the last tick saw of one volume.
type VolumeStatus struct {
	Paths nvme.PathReport
	// Notes are the pending defects and verdicts of the last tick that
	// concern the volume, e.g. "ControllerNotContributing deferred: grace:
	// nvme4 is 2s old, 3s left", and backed-off endpoints.
	Notes []string
}

// New validates the configuration.
func New(cfg Config, deps Deps) (*Monitor, error) {
	if deps.Intents == nil || deps.Policy == nil || deps.Connector == nil || deps.Prober == nil || deps.SysFS.Root() == "" {
		return nil, errors.New("monitor: intents, policy, connector, prober and sysfs are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 3 * time.Second
	}
	if cfg.Jitter < 0 || cfg.Jitter > 1 {
		return nil, fmt.Errorf("monitor: jitter %v is outside 0..1", cfg.Jitter)
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = 0.2
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
	if deps.PathExists == nil {
		deps.PathExists = func(p string) bool { _, err := os.Stat(p); return err == nil }
	}
	return &Monitor{cfg: cfg, deps: deps, back: newBackoff(cfg.BackoffBase, cfg.BackoffMax), reach: newReachability(),
		nvme:   nvme.NewReader(deps.SysFS, nvme.ScopePaths),
		status: map[string]VolumeStatus{}, orphans: map[string]bool{}, replaced: map[string]bool{},
		align: newAlignment(),
		gate:  heal.NewLogGate(0, deps.Clock.Now)}, nil
}

// Run ticks at once (a restarted plugin heals in its first tick) and then
// every Interval plus jitter, until ctx ends. At -v=4 each tick starts with
// a "Monitor tick" line carrying its number: a property such as "within
// two ticks" is read from the log in ticks, which stay ticks when a loaded
// node runs them late.
func (m *Monitor) Run(ctx context.Context) error {
	klog.InfoS("Monitor started", "interval", m.cfg.Interval, "mode", m.deps.Policy.Mode())
	for n := uint64(1); ; n++ {
		klog.V(4).InfoS("Monitor tick", "tick", n)
		m.Tick(ctx)
		wait := m.cfg.Interval + time.Duration(rand.Float64()*m.cfg.Jitter*float64(m.cfg.Interval))
		select {
		case <-ctx.Done():
			return nil
		case <-m.deps.Clock.After(wait):
		}
	}
}

// LastTick is when the last tick ended; zero before the first.
func (m *Monitor) LastTick() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastTick
}

// Status returns what the last tick saw of a volume.
func (m *Monitor) Status(volumeID string) (VolumeStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.status[volumeID]
	return s, ok
}
