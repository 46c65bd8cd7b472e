package monitor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Events is the kernel's uevents as the loop takes them (*uevent.Source):
// Ready receives when a batch may be waiting, Take takes it (empty when
// none is).
type Events interface {
	Ready() <-chan struct{}
	Take() uevent.Batch
}

// EventReport is what the loop did with one batch of kernel events, the
// event jobs that ended, and the deferred decisions that fell due.
type EventReport struct {
	// Full is set when events were lost and the loop read every target
	// (a tick, whose report is Tick).
	Full bool
	Tick Report
	// Decisions are the loop's decisions on the targets the batch named
	// (one per target, however many events named it), then those on the
	// targets whose event job ended or whose deferred decision fell due.
	Decisions []Decision
	// Jobs are the event jobs that ended.
	Jobs []model.Result
	// Unresolved counts the events that named no target the loop knows
	// of (another driver's objects, a loop device's, an object already
	// gone that no read had seen).
	Unresolved int
}

// Decision is the loop's decision on one target after kernel events
// named it.
type Decision struct {
	Target volume.Target
	// Events are the events that named the target, in the kernel's
	// order (String form); "job ended" or "revisit" for a follow-up.
	Events []string
	// Seqs are the kernel's sequence numbers of those events (a revisit
	// after a removal keeps its remove event's; logged
	// whole, as ranges, where Events is cut short): what names the
	// events the decision answers.
	Seqs []uint64
	// Started is set when a job on the target started.
	Started bool
	// Read is set when the transport read the target's objects.
	Read bool
	// Words are the decision as logged: "job started: …", "no job: …",
	// "busy: …", "job running: …".
	Words string
	// Latency is from the receipt of the first event to the decision.
	Latency time.Duration
}

// burst is what the loop knows of one target's events between two
// decisions: the events, and when the first was received.
type burst struct {
	events []string
	seqs   []uint64
	first  time.Time
	// again is set when events came while the target's event job ran:
	// the loop decides on the target again when the job ends.
	again bool
	// removed are the objects remove events named, and tries how many
	// reads already found one of them still there.
	removed []string
	tries   int
	// added is set when an event added a block device: a namespace's
	// head or one of its legs.
	added bool
}

func (b *burst) add(e uevent.Event) {
	b.events = append(b.events, e.String())
	b.seqs = append(b.seqs, e.Seq)
	if e.Action == uevent.Remove {
		b.removed = append(b.removed, e.Name())
	}
	if e.Action == uevent.Add && e.Subsystem == "block" {
		b.added = true
	}
	if !e.Received.IsZero() && (b.first.IsZero() || e.Received.Before(b.first)) {
		b.first = e.Received
	}
}

// fullSpacing is the least time between two full reads a loss of events
// calls for: a socket that keeps overflowing costs at most one read of
// the node every fullSpacing (a tenth of the interval, at least 1 s).
func (c Config) fullSpacing() time.Duration {
	return max(time.Second, c.Interval/10)
}

// HandleEvents is the loop's answer to kernel events, between ticks, on
// the loop's goroutine (Run calls it; a test or the node simulation calls
// it where Run would):
//
//   - events were lost (b.Lost): every target is read, as a tick (Tick),
//     at most once every fullSpacing (a loss within it is read at its
//     end);
//   - the events of b, grouped by the target their objects serve (the
//     model's Snapshot.TargetOf; a new object through its transport's
//     TargetOf): per target, one read of its objects only and its
//     transport's plan for it (Transport.PlanTarget), written into the
//     model; when the plan needs a job, the job starts with the target's
//     lease (the intent owner's Go). A target whose event job still runs
//     is decided on again when the job ends: a burst of events for one
//     target is one job, and one more decision after it;
//   - event jobs that ended: their outcomes are counted, their target
//     read again and written with the job's notes (and decided on again
//     when events came meanwhile);
//   - deferred decisions that fell due (a grace, a cooldown or a backoff
//     a plan or a job ran into): their target is decided on again.
//
// Every transport is told of the batch first (Transport.Notice), losses
// included, so that no listing it keeps outlives an object the batch
// added or removed.
//
// Events are hints: the plan decides on its own read, and the job on a
// read under the lease, with the heal policy's grace, cooldown and
// co-tenant rules.
func (m *Monitor) HandleEvents(ctx context.Context, b uevent.Batch) EventReport {
	var rep EventReport
	for _, tr := range m.deps.Transports {
		tr.Notice(b)
	}
	now := m.deps.Clock.Now()
	if len(b.Lost) > 0 || m.ev.fullDue(now, m.cfg.fullSpacing()) {
		if len(b.Lost) > 0 {
			m.ev.fullPending = true
			why := make([]string, len(b.Lost))
			for i, l := range b.Lost {
				why[i] = string(l)
			}
			klog.V(2).InfoS("Kernel events were lost; reading every target", "reason", strings.Join(why, ","))
		}
		if m.ev.lastFull.IsZero() || now.Sub(m.ev.lastFull) >= m.cfg.fullSpacing() {
			m.ev.fullPending = false
			m.ev.lastFull = now
			m.deps.Metrics.ObserveEventRefresh("full")
			rep.Full = true
			rep.Tick = m.Tick(ctx)
		}
	}
	m.settleEventJobs(ctx, &rep)
	m.revisitDue(ctx, &rep)

	snap := m.deps.Model.Snapshot()
	groups := map[volume.Target]*burst{}
	for _, e := range b.Events {
		t, ok := m.targetOf(snap, e)
		if !ok {
			rep.Unresolved++
			klog.V(5).InfoS("Kernel event names no target pathmend knows", "event", e.String())
			continue
		}
		g := groups[t]
		if g == nil {
			g = &burst{}
			groups[t] = g
		}
		g.add(e)
	}
	targets := make([]volume.Target, 0, len(groups))
	for t := range groups {
		targets = append(targets, t)
	}
	slices.SortFunc(targets, volume.Target.Compare)
	var listing *volume.Listing
	for _, t := range targets {
		rep.Decisions = append(rep.Decisions, m.decide(ctx, t, groups[t], snap, &listing, nil, true))
	}
	// A synchronous runner ran the jobs inside Go.
	m.settleEventJobs(ctx, &rep)
	return rep
}

// NextDue is when the loop next has something to do between ticks that no
// event will announce: a deferred decision falling due, or a full read a
// loss called for within fullSpacing of the last. Zero when nothing is
// due.
func (m *Monitor) NextDue() time.Time {
	var next time.Time
	for _, at := range m.ev.revisit {
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if m.ev.fullPending {
		at := m.ev.lastFull.Add(m.cfg.fullSpacing())
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// eventState is what the loop keeps between two batches of events (the
// loop's goroutine only; done is the event jobs' hand-over, under
// Monitor.mu).
type eventState struct {
	// running are the targets whose event job has not been settled, with
	// the events that came meanwhile.
	running map[volume.Target]*burst
	// revisit holds, per target, when a decision deferred by a grace, a
	// cooldown or a backoff may be taken.
	revisit map[volume.Target]time.Time
	// lingering holds, per target, the removed objects a read still
	// found (removalSettle).
	lingering map[volume.Target]*burst
	// recorded are the targets the last listing of the records (the
	// tick's, or a batch's) found a record of, readable or not, and
	// recordedGen the records' generation (Intents.Generation) that
	// listing began at; nil when it could not tell. While no record was
	// written or removed since, a target not among them has no record:
	// an event naming one (another driver's subsystem, a session of
	// another target) is decided without listing the records again.
	recorded    map[volume.Target]bool
	recordedGen uint64
	// lastFull is when the last full read a loss called for began;
	// fullPending is set while one is owed.
	lastFull    time.Time
	fullPending bool
	// jobs receives when an event job ended (capacity 1).
	jobs chan struct{}
}

func newEventState() eventState {
	return eventState{running: map[volume.Target]*burst{}, revisit: map[volume.Target]time.Time{}, lingering: map[volume.Target]*burst{}, jobs: make(chan struct{}, 1)}
}

// fullDue reports whether the full read a loss called for is due at now.
func (s *eventState) fullDue(now time.Time, spacing time.Duration) bool {
	return s.fullPending && !now.Before(s.lastFull.Add(spacing))
}

// targetOf is the target an event's objects serve: the first object (the
// event's own, then its ancestors) the model knows, else the first a
// transport names from sysfs.
func (m *Monitor) targetOf(snap *model.Snapshot, e uevent.Event) (volume.Target, bool) {
	objs := uevent.Objects(e)
	for _, o := range objs {
		if t, ok := snap.TargetOf(o.Name); ok {
			return t, true
		}
		if s := o.Session(); s != "" && s != o.Name {
			if t, ok := snap.TargetOf(s); ok {
				return t, true
			}
		}
	}
	for _, o := range objs {
		for _, tr := range m.deps.Transports {
			if t, ok := tr.TargetOf(o); ok {
				return t, true
			}
		}
	}
	return volume.Target{}, false
}

// decide reads and plans target t, writes what it read into the model
// (with notes, a job's that just ended, added to the plan's), and starts
// its job when the plan needs one and jobs may start (mayStart: not after
// a job no event followed, whose deferred verdicts are revisited when
// they may change instead). listing is the store's listing, read at
// most once per batch, for targets the model does not have as owned.
func (m *Monitor) decide(ctx context.Context, t volume.Target, g *burst, snap *model.Snapshot, listing **volume.Listing, notes map[string][]string, mayStart bool) (d Decision) {
	d = Decision{Target: t, Events: g.events, Seqs: g.seqs}
	tr := m.tr[t.Transport]
	if tr == nil {
		return d
	}
	defer func() {
		if !g.first.IsZero() {
			d.Latency = m.deps.Clock.Since(g.first)
			m.deps.Metrics.ObserveEventDecision(d.Latency)
		}
		klog.V(2).InfoS("Kernel event decision", "target", t.String(), "events", summarize(d.Events), "seqs", seqRanges(d.Seqs), "decision", d.Words, "sinceEvent", d.Latency)
	}()
	if run, ok := m.ev.running[t]; ok {
		run.again = true
		run.events = append(run.events, g.events...)
		run.seqs = append(run.seqs, g.seqs...)
		if run.first.IsZero() {
			run.first = g.first
		}
		d.Words = "job running: decided again when it ends"
		return d
	}
	r, ok := m.round(t, snap, listing)
	if !ok {
		d.Words = "no job: not a target of the loop's scope"
		return d
	}
	st := m.deps.Model.Stamp(m.deps.Clock.Now())
	plan := tr.PlanTarget(ctx, r)
	d.Read = plan.Read
	if plan.Read {
		m.deps.Metrics.ObserveEventRefresh("target")
		for i := range plan.Volumes {
			v := &plan.Volumes[i]
			if n := notes[v.ID]; len(n) > 0 {
				v.Notes = append(slices.Clip(v.Notes), n...)
			}
		}
		m.writeTarget(st, r.Listing.Records, plan.Volumes, false)
	}
	delete(m.ev.revisit, t)
	delete(m.ev.lingering, t)
	if !plan.Revisit.IsZero() {
		m.ev.revisit[t] = plan.Revisit
	}
	if plan.Read && g.tries < removalTries && stillNamed(plan.Volumes, g.removed) {
		// The kernel announces a removal before it drops the object's
		// directory (device_del sends the uevent, then deletes the
		// kobject; in the lab a head removed stayed readable for tens of
		// milliseconds): the read saw the object still there, so the
		// target is read again shortly, not at the tick.
		at := m.deps.Clock.Now().Add(removalSettle)
		if cur, ok := m.ev.revisit[t]; !ok || at.Before(cur) {
			m.ev.revisit[t] = at
		}
		m.ev.lingering[t] = &burst{removed: g.removed, tries: g.tries + 1, first: g.first, seqs: g.seqs}
	}
	if plan.Holder == "" || !mayStart || m.deps.Policy.Mode() == heal.ModeOff {
		d.Words = "no job: " + plan.Why
		return d
	}
	if g.added {
		// The kernel adds a namespace's head and then its legs, one per
		// controller, each as that controller's scan gets to it: read
		// right at the add, a controller whose leg is still on its way
		// looks as if it contributed nothing (in the lab a live, healthy
		// controller was torn down 220 ms after a rescan brought a
		// namespace back). The job waits for the legs to settle; the
		// target is decided on again then, on a fresh read.
		at := m.deps.Clock.Now().Add(addSettle)
		if cur, ok := m.ev.revisit[t]; !ok || at.Before(cur) {
			m.ev.revisit[t] = at
		}
		d.Words = fmt.Sprintf("deferred %s: a block device was just added and its namespace's legs may still be on their way; %s", addSettle, plan.Why)
		return d
	}
	m.ev.running[t] = &burst{}
	started, busy := m.deps.Intents.Go(ctx, t, plan.Holder, m.eventJob(tr))
	if !started {
		delete(m.ev.running, t)
		d.Words = "busy: " + busy + "; " + plan.Why
		return d
	}
	d.Started = true
	d.Words = "job started: " + plan.Why
	return d
}

// round is what transport planning of target t is given: the records of
// its owned entries, read again from the store (a per-volume read, no
// scan); or, for a target the model does not have as owned, the store's
// listing of it, which says whether a record names it (owned) or not
// (foreign). ok is false when the target is in none of the loop's
// scopes.
func (m *Monitor) round(t volume.Target, snap *model.Snapshot, listing **volume.Listing) (model.TargetRound, bool) {
	r := model.TargetRound{Target: t}
	if m.cfg.Scope.Owned {
		for _, v := range snap.OfTarget(t) {
			if v.Scope != model.Owned {
				continue
			}
			rec, err := m.deps.Intents.Get(v.ID)
			if err != nil {
				continue // unstaged since: the next tick drops it
			}
			r.Listing.Records = append(r.Listing.Records, rec)
		}
		if len(r.Listing.Records) > 0 {
			r.Owned = true
			return r, true
		}
	}
	gen := m.deps.Intents.Generation()
	if m.ev.recorded != nil && m.ev.recordedGen == gen && !m.ev.recorded[t] {
		r.Foreign = m.cfg.Scope.Foreign
		return r, r.Foreign
	}
	if *listing == nil {
		l, err := m.deps.Intents.Scan()
		m.ev.recorded, m.ev.recordedGen = recordedTargets(l, err), gen
		if err != nil {
			// Whose the target is cannot be told: leave it to the tick.
			klog.ErrorS(err, "Staged-volume records could not be listed; a kernel event's target is left to the tick", "target", t.String())
			return r, false
		}
		*listing = &l
	}
	r.Listing = (*listing).Of(t)
	switch {
	case len(r.Listing.Records) > 0 || len(r.Listing.Unreadable) > 0:
		r.Owned = m.cfg.Scope.Owned
	default:
		r.Foreign = m.cfg.Scope.Foreign
	}
	return r, r.Owned || r.Foreign
}

// eventJob is the job on one target an event's plan started: the
// transport's job, whose result the loop settles (settleEventJobs) as
// soon as it ends, not at the next tick. It releases the lease before it
// says it ended, so that the loop can start the next job on the target.
func (m *Monitor) eventJob(tr Transport) func(context.Context, *intent.Lease) {
	return func(ctx context.Context, lease *intent.Lease) {
		res := tr.Job(ctx, lease)
		res.Target = lease.Target()
		lease.Unlock()
		m.mu.Lock()
		m.evDone = append(m.evDone, jobResult{Result: res})
		m.mu.Unlock()
		select {
		case m.ev.jobs <- struct{}{}:
		default:
		}
	}
}

// settleEventJobs reads the event jobs that ended: counts their outcomes,
// reads their target again (a job that changed the kernel made the model's
// entry old) and writes it with the job's notes; decides again on a target
// events named while its job ran; and notes when a deferred verdict of
// the job may change.
func (m *Monitor) settleEventJobs(ctx context.Context, rep *EventReport) {
	m.mu.Lock()
	done := m.evDone
	m.evDone = nil
	m.mu.Unlock()
	if len(done) == 0 {
		return
	}
	slices.SortFunc(done, func(a, b jobResult) int { return a.Target.Compare(b.Target) })
	snap := m.deps.Model.Snapshot()
	var listing *volume.Listing
	for _, res := range done {
		t := res.Target
		m.deps.Metrics.ObserveOutcomes(string(t.Transport), res.Outcomes)
		rep.Jobs = append(rep.Jobs, res.Result)
		g := m.ev.running[t]
		delete(m.ev.running, t)
		if g == nil {
			g = &burst{}
		}
		again := g.again
		if !again {
			g = &burst{events: []string{"job ended"}}
		}
		d := m.decide(ctx, t, g, snap, &listing, res.Notes, again)
		rep.Decisions = append(rep.Decisions, d)
		for _, o := range res.Outcomes {
			if o.Verdict == heal.Deferred && !o.Until.IsZero() {
				if at, ok := m.ev.revisit[t]; !ok || o.Until.Before(at) {
					m.ev.revisit[t] = o.Until
				}
			}
		}
	}
}

// removalSettle is how long after a read that still found an object a
// remove event named the target is read again, at most removalTries
// times.
const (
	removalSettle = 50 * time.Millisecond
	removalTries  = 5
)

// addSettle is how long a job an event that added a block device called
// for waits, for the namespace's other legs to appear.
const addSettle = 2 * time.Second

// stillNamed reports whether any of vols names one of the objects (a
// path's controller or session, a block device).
func stillNamed(vols []model.Volume, objects []string) bool {
	for _, o := range objects {
		for _, v := range vols {
			for _, p := range v.Paths {
				if p.Object == o {
					return true
				}
			}
			for _, d := range v.Devices {
				if d.Name == o {
					return true
				}
			}
		}
	}
	return false
}

// revisitDue decides again on the targets whose deferred decision fell
// due.
func (m *Monitor) revisitDue(ctx context.Context, rep *EventReport) {
	now := m.deps.Clock.Now()
	var due []volume.Target
	for t, at := range m.ev.revisit {
		if !now.Before(at) {
			due = append(due, t)
		}
	}
	if len(due) == 0 {
		return
	}
	slices.SortFunc(due, volume.Target.Compare)
	snap := m.deps.Model.Snapshot()
	var listing *volume.Listing
	for _, t := range due {
		delete(m.ev.revisit, t)
		g := &burst{events: []string{"revisit"}}
		if l := m.ev.lingering[t]; l != nil {
			g.removed, g.tries, g.first, g.seqs = l.removed, l.tries, l.first, l.seqs
			g.events = []string{"revisit: " + strings.Join(l.removed, ", ") + " removed"}
		}
		rep.Decisions = append(rep.Decisions, m.decide(ctx, t, g, snap, &listing, nil, true))
	}
}

// summarize renders the events of a decision for its log line: the first
// few, and how many more.
func summarize(events []string) string {
	const show = 4
	if len(events) <= show {
		return strings.Join(events, ", ")
	}
	return strings.Join(events[:show], ", ") + fmt.Sprintf(" and %d more", len(events)-show)
}

// seqRanges renders sequence numbers for a log line as ranges in the
// kernel's order ("970-973,980"), at most maxSeqRanges of them, then how
// many numbers more.
func seqRanges(seqs []uint64) string {
	const maxSeqRanges = 16
	var b strings.Builder
	ranges := 0
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if ranges == maxSeqRanges {
			fmt.Fprintf(&b, " and %d more", len(seqs)-i)
			break
		}
		if ranges > 0 {
			b.WriteByte(',')
		}
		ranges++
		if j == i {
			fmt.Fprintf(&b, "%d", seqs[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", seqs[i], seqs[j])
		}
		i = j + 1
	}
	return b.String()
}
