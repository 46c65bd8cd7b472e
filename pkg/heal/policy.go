package heal

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Defaults of the policy flags.
const (
	// DefaultGrace is how young a controller may be before a teardown that
	// includes it is deferred: a controller connected a moment ago may not
	// have attached its namespace yet (measured: 97 ms), and is then
	// indistinguishable from one that never will.
	DefaultGrace = 5 * time.Second
	// DefaultCooldown is how long a repaired key is left alone, so a
	// repair that did not help is not repeated every tick.
	DefaultCooldown = 60 * time.Second
	// relogInterval is how often an unchanged deferral or refusal of the
	// same key is logged again.
	relogInterval = 10 * time.Minute
)

// Verdict is the outcome of deciding on one defect.
type Verdict string

const (
	// Repaired: the teardown ran and succeeded.
	Repaired Verdict = "repaired"
	// Observed: the policy would repair, but the mode is observe.
	Observed Verdict = "observed"
	// Deferred: not now (grace, cooldown); decided again later.
	Deferred Verdict = "deferred"
	// Refused: repairing would cost more than it saves (co-tenants, scope
	// cap); decided again later, in case the situation changes.
	Refused Verdict = "refused"
	// Failed: the teardown ran and returned an error.
	Failed Verdict = "failed"
)

// Repairer is the mechanism: it executes a defect's teardown plan exactly
// as given and returns the paths it removed (the monitor reconnects their
// endpoints in the same tick).
type Repairer interface {
	Repair(ctx context.Context, d Defect) (removed []Path, err error)
}

// FirstStepper is implemented by a Repairer that has a non-destructive
// first step for some defects: the NVMe repair rescans a missing
// namespace before it would tear anything down. Such a step costs nobody
// a path, so the policy runs it whatever it decides about the teardown —
// a teardown refused for its co-tenants, capped by scope or deferred does
// not hold back a rescan — under a cooldown of its own, in repair mode
// only.
type FirstStepper interface {
	// FirstStep names the non-destructive step of d, e.g. "rescan nvme0,
	// nvme1"; "" when d has none.
	FirstStep(d Defect) string
	// TryFirstStep runs it and reports whether the defect is gone
	// afterwards.
	TryFirstStep(ctx context.Context, d Defect) (cured bool, err error)
}

// firstStepKey is the cooldown key of a defect's first step.
func firstStepKey(d Defect) string { return d.Key + " (first step)" }

// Config configures a Policy.
type Config struct {
	// Mode is repair, observe or off.
	Mode Mode
	// Grace defers a teardown that includes a controller younger than
	// this. Zero means DefaultGrace.
	Grace time.Duration
	// Cooldown leaves a key alone after a repair. Zero means
	// DefaultCooldown.
	Cooldown time.Duration
	// MaxScope caps what a repair may tear down. Zero means
	// ScopeSubsystem (no cap beyond the widest scope).
	MaxScope Scope
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Outcome is the decision (and, for a repair, the result) on one defect.
type Outcome struct {
	Defect  Defect
	Verdict Verdict
	// Reason says why, e.g. "grace: nvme4 is 97ms old, 4.9s left".
	Reason string
	// Class is the bounded form of Reason (the metric's reason label).
	Class Class
	// Removed are the paths a repair tore down.
	Removed []Path
	// Err is the repair error of a Failed outcome.
	Err error
	// Until is when a Deferred verdict may change: the end of the
	// cooldown or of the grace that deferred it; zero otherwise. The loop
	// decides on the defect again then instead of at its next tick.
	Until time.Time
	// FirstStep says what the non-destructive first step did this time
	// (see FirstStepper), e.g. "rescan nvme0, nvme1: the namespace is
	// still missing"; "" when none ran. It ran whatever the verdict on
	// the teardown says.
	FirstStep string
}

// Policy decides whether a defect may be repaired now. One Policy is built
// per process and shared by NodeStage's attach-time repair, the monitor and
// the iSCSI session heal, so cooldowns hold across all of them. It is safe
// for concurrent use.
type Policy struct {
	cfg Config

	mu       sync.Mutex
	cooldown *Window            // cooldown key → last repair attempt
	logged   map[string]logMark // cooldown key → last logged verdict
}

type logMark struct {
	what string
	at   time.Time
}

// NewPolicy validates cfg and returns a Policy.
func NewPolicy(cfg Config) (*Policy, error) {
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.Grace < 0 || cfg.Cooldown < 0 {
		return nil, errors.New("grace and cooldown must not be negative")
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.MaxScope == 0 {
		cfg.MaxScope = ScopeSubsystem
	}
	if cfg.MaxScope < ScopeController || cfg.MaxScope > ScopeSubsystem {
		return nil, fmt.Errorf("invalid scope cap %v", cfg.MaxScope)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Policy{cfg: cfg, cooldown: NewWindow(cfg.Cooldown, cfg.Now), logged: map[string]logMark{}}, nil
}

// Mode returns the policy's mode.
func (p *Policy) Mode() Mode { return p.cfg.Mode }

// Left returns how long key must still wait in the policy's cooldown, and
// how long ago it was last repaired; left is zero when it may be repaired
// now. A transport whose repairs are not Defect teardowns (the iSCSI
// session heal's logins and relogins) keeps its cooldowns here through
// Left and Mark, so one --heal-cooldown governs every repair.
func (p *Policy) Left(key string) (left, ago time.Duration) { return p.cooldown.Left(key) }

// Mark starts key's cooldown now (a repair ran, whatever its result).
func (p *Policy) Mark(key string) { p.cooldown.Mark(key) }

// MarkAt starts key's cooldown at t: when a repair decided then began
// (it may be recorded after it ran).
func (p *Policy) MarkAt(key string, t time.Time) { p.cooldown.MarkAt(key, t) }

// Heal decides on every defect, narrowest scope first, and in repair mode
// runs the allowed teardowns through r. In off mode it returns nil and
// touches nothing. A defect whose teardown overlaps paths an earlier repair
// of this call already removed is skipped: it was about the same objects.
func (p *Policy) Heal(ctx context.Context, defects []Defect, r Repairer) []Outcome {
	if p.cfg.Mode == ModeOff || len(defects) == 0 {
		return nil
	}
	ordered := append([]Defect(nil), defects...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].Scope < ordered[j].Scope })

	p.mu.Lock()
	p.prune()
	p.mu.Unlock()

	removed := map[string]bool{}
	var out []Outcome
	for _, d := range ordered {
		if overlaps(d, removed) {
			continue
		}
		o := p.decide(d)
		// One teardown per call: every defect was inspected on one read
		// of the target, taken before the first teardown, so a second
		// teardown's co-tenant check is stale (two controllers, each the
		// other's co-tenants' remaining path, would both pass it). It is
		// decided again on the next read.
		if o.Verdict == Repaired && len(removed) > 0 {
			continue
		}
		first, cured := p.firstStep(ctx, d, r)
		switch {
		case cured:
			o = Outcome{Defect: d, Verdict: Repaired, Class: ClassFirstStepCured, Reason: first + "; nothing torn down"}
		case o.Verdict == Repaired && p.cfg.Mode == ModeObserve: // allowed: observe
			o.Verdict, o.Class, o.Reason = Observed, ClassObserveMode, "observe mode: would tear down "+pathNames(d.Teardown)
		case o.Verdict == Repaired: // allowed: act
			o = p.run(ctx, d, r)
			for _, rp := range o.Removed {
				removed[rp.Name] = true
			}
		}
		o.FirstStep = first
		p.log(o)
		out = append(out, o)
	}
	return out
}

// firstStep runs d's non-destructive first step when r has one for d,
// the mode is repair and the step's own cooldown allows, whatever the
// policy decides about the teardown. It returns what the step did ("" when
// it did not run) and whether the defect is gone.
func (p *Policy) firstStep(ctx context.Context, d Defect, r Repairer) (did string, cured bool) {
	fs, ok := r.(FirstStepper)
	if !ok || p.cfg.Mode != ModeRepair {
		return "", false
	}
	step := fs.FirstStep(d)
	if step == "" {
		return "", false
	}
	key := firstStepKey(d)
	if left, _ := p.cooldown.Left(key); left > 0 {
		return "", false
	}
	p.cooldown.Mark(key)
	cured, err := fs.TryFirstStep(ctx, d)
	switch {
	case err != nil:
		return fmt.Sprintf("%s failed: %v", step, err), false
	case cured:
		return step + ": the defect is gone", true
	}
	return step + ": the defect remains", false
}

// decide applies the rules in order: a teardown the intent owner blocks,
// scope cap, co-tenant gate, cooldown, grace. An allowed defect comes back
// with Verdict Repaired (not yet run).
func (p *Policy) decide(d Defect) Outcome {
	now := p.cfg.Now()
	if d.Blocked != "" {
		// No kind is exempt: an unreadable record may be a volume whose
		// namespace has not appeared yet.
		return Outcome{Defect: d, Verdict: Refused, Class: ClassUnreadableRecord, Reason: "unreadable record: " + d.Blocked}
	}
	if d.Scope > p.cfg.MaxScope {
		return Outcome{Defect: d, Verdict: Refused, Class: ClassScopeCap, Reason: fmt.Sprintf("scope %s exceeds the cap %s", d.Scope, p.cfg.MaxScope)}
	}
	// NoNamespace is exempt: the subsystem exports nothing, so there is no
	// co-tenant device to destroy, and gating it would leave the volume
	// stuck forever.
	if len(d.CoTenants) > 0 && d.Kind != NoNamespace {
		return Outcome{Defect: d, Verdict: Refused, Class: ClassCoTenants, Reason: "would leave co-tenants with no accessible path: " + coTenantNames(d.CoTenants)}
	}
	if left, ago := p.cooldown.Left(d.Key); left > 0 {
		return Outcome{Defect: d, Verdict: Deferred, Class: ClassCooldown, Reason: fmt.Sprintf("cooldown: repaired %s ago, %s left", round(ago), round(left)), Until: now.Add(left)}
	}
	for _, path := range d.Teardown {
		if path.CreatedAt.IsZero() {
			continue // unknown age: not young as far as anyone can tell
		}
		if age := now.Sub(path.CreatedAt); age < p.cfg.Grace {
			return Outcome{Defect: d, Verdict: Deferred, Class: ClassGrace, Reason: fmt.Sprintf("grace: %s is %s old, %s left", path.Name, round(age), round(p.cfg.Grace-age)),
				Until: path.CreatedAt.Add(p.cfg.Grace)}
		}
	}
	return Outcome{Defect: d, Verdict: Repaired}
}

// run executes an allowed repair and starts its cooldown, success or not:
// a failing repair must not be retried every tick either.
func (p *Policy) run(ctx context.Context, d Defect, r Repairer) Outcome {
	removed, err := r.Repair(ctx, d)
	p.cooldown.Mark(d.Key)
	if err != nil {
		return Outcome{Defect: d, Verdict: Failed, Class: ClassTeardownFailed, Reason: "teardown failed", Removed: removed, Err: err}
	}
	return Outcome{Defect: d, Verdict: Repaired, Class: ClassTornDown, Reason: "tore down " + pathNames(removed), Removed: removed}
}

// prune drops cooldowns and log marks that can no longer matter, so memory
// stays bounded by the defects of the last cooldown window. p.mu is held.
func (p *Policy) prune() {
	now := p.cfg.Now()
	p.cooldown.Prune()
	for k, m := range p.logged {
		if now.Sub(m.at) >= relogInterval {
			delete(p.logged, k)
		}
	}
}

// log writes one level-0 line per verdict. A deferral or refusal that
// repeats unchanged tick after tick is logged once (again after
// relogInterval); repairs, failures and observations are always logged.
func (p *Policy) log(o Outcome) {
	d := o.Defect
	// A deferral or refusal is logged once while it stays the same; one
	// whose first step just ran is news (the step is logged with it), and
	// the ticks after it repeat it no more than before.
	if o.Verdict == Deferred || o.Verdict == Refused {
		what := string(o.Verdict) + ":" + string(o.Class)
		p.mu.Lock()
		m, seen := p.logged[d.Key]
		if seen && m.what == what && o.FirstStep == "" {
			p.mu.Unlock()
			return
		}
		p.logged[d.Key] = logMark{what: what, at: p.cfg.Now()}
		p.mu.Unlock()
	}
	kv := []any{
		"verdict", o.Verdict, "defect", d.Kind, "scope", d.Scope, "key", d.Key,
		"controllers", pathNames(d.Teardown), "coTenants", coTenantNames(d.CoTenants),
		"volumes", strings.Join(d.Volumes, ","), "reason", o.Reason, "mode", p.cfg.Mode,
	}
	if o.FirstStep != "" {
		kv = append(kv, "firstStep", o.FirstStep)
	}
	if o.Err != nil {
		klog.ErrorS(o.Err, "Heal verdict", kv...)
		return
	}
	klog.InfoS("Heal verdict", kv...)
}

func overlaps(d Defect, removed map[string]bool) bool {
	for _, p := range d.Teardown {
		if removed[p.Name] {
			return true
		}
	}
	return false
}

func pathNames(ps []Path) string {
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		if p.Endpoint != "" {
			names = append(names, p.Name+" ("+p.Endpoint+")")
		} else {
			names = append(names, p.Name)
		}
	}
	return strings.Join(names, ", ")
}

func coTenantNames(cs []CoTenant) string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.Namespace+" ("+c.Device+")")
	}
	return strings.Join(names, ", ")
}

// round keeps durations readable in reasons: ms below a second, 0.1 s above.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// Plan is a dry run: it decides on every defect the way Heal would in
// repair mode — same order, same rules, the cooldowns this Policy holds —
// but runs, records and logs nothing. An allowed repair comes back
// Observed with "would tear down …". `pathmend diagnose --plan` prints it.
func (p *Policy) Plan(defects []Defect) []Outcome {
	ordered := append([]Defect(nil), defects...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].Scope < ordered[j].Scope })
	removed := map[string]bool{}
	var out []Outcome
	for _, d := range ordered {
		if overlaps(d, removed) {
			continue
		}
		o := p.decide(d)
		// One teardown per call: every defect was inspected on one read
		// of the target, taken before the first teardown, so a second
		// teardown's co-tenant check is stale (two controllers, each the
		// other's co-tenants' remaining path, would both pass it). It is
		// decided again on the next read.
		if o.Verdict == Repaired && len(removed) > 0 {
			continue
		}
		if o.Verdict == Repaired {
			o.Verdict, o.Class, o.Reason = Observed, ClassObserveMode, "would tear down "+pathNames(d.Teardown)
			for _, rp := range d.Teardown {
				removed[rp.Name] = true
			}
		}
		out = append(out, o)
	}
	return out
}
