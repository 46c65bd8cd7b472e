package heal

import (
	"sync"
	"time"
)

// This file holds the transport-neutral pieces of a heal that watches a
// condition over time rather than deciding on one snapshot: how long a
// condition has held without interruption, an action budget of once per
// window, and a log gate that writes a verdict once per change. The iSCSI
// session heal is built on them; nothing here knows a transport.

// Kicked is the verdict of a repair that ran and whose effect is still
// awaited: the mechanism returned, but the path is not back yet. It is
// resolved later into Repaired (the path came back) or Failed (it did not
// within the verify window).
const Kicked Verdict = "kicked"

// Streaks measures, per key, how long a condition has held continuously as
// seen by the observer. The kernel publishes no timestamp for "down since"
// or "reachable since", so the clock starts at the first sighting: after a
// process restart every streak starts again from zero, which errs on the
// side of waiting longer. One interruption resets the streak. Streaks is
// safe for concurrent use.
type Streaks struct {
	now func() time.Time

	mu    sync.Mutex
	since map[string]time.Time
	seen  map[string]bool
}

// NewStreaks returns empty Streaks on the clock now (time.Now when nil).
func NewStreaks(now func() time.Time) *Streaks {
	if now == nil {
		now = time.Now
	}
	return &Streaks{now: now, since: map[string]time.Time{}, seen: map[string]bool{}}
}

// Observe records whether the condition of key holds now and returns how
// long it has held without interruption; zero when it does not hold. The
// first sighting of a holding condition starts its streak at now.
func (s *Streaks) Observe(key string, holds bool) time.Duration {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[key] = true
	if !holds {
		delete(s.since, key)
		return 0
	}
	start, ok := s.since[key]
	if !ok {
		s.since[key] = now
		return 0
	}
	return now.Sub(start)
}

// Held returns how long the condition of key has held, as of the last
// Observe, measured up to now; ok is false when it does not hold.
func (s *Streaks) Held(key string) (d time.Duration, ok bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	start, ok := s.since[key]
	if !ok {
		return 0, false
	}
	return now.Sub(start), true
}

// Sweep forgets every key not observed since the previous Sweep, so memory
// is bounded by the keys of one pass. A key that disappears (a session
// logged out, a portal no longer probed) starts from zero if it returns.
func (s *Streaks) Sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.since {
		if !s.seen[k] {
			delete(s.since, k)
		}
	}
	s.seen = map[string]bool{}
}

// Window allows an action at most once per period per key: a per-node
// budget for a repair whose blast radius is too wide to repeat often. A
// mark counts whether the action succeeded or not. Window is safe for
// concurrent use.
type Window struct {
	period time.Duration
	now    func() time.Time

	mu   sync.Mutex
	last map[string]time.Time
}

// NewWindow returns a Window of the given period on the clock now
// (time.Now when nil).
func NewWindow(period time.Duration, now func() time.Time) *Window {
	if now == nil {
		now = time.Now
	}
	return &Window{period: period, now: now, last: map[string]time.Time{}}
}

// Left returns how long key must still wait, and how long ago it was last
// marked; left is zero when the action is allowed now.
func (w *Window) Left(key string) (left, ago time.Duration) {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.last[key]
	if !ok {
		return 0, 0
	}
	ago = now.Sub(t)
	if ago >= w.period {
		delete(w.last, key)
		return 0, ago
	}
	return w.period - ago, ago
}

// Mark records that the action of key ran now.
func (w *Window) Mark(key string) { w.MarkAt(key, w.now()) }

// MarkAt records that the action of key ran at t: a time remembered from
// before a restart of the process.
func (w *Window) MarkAt(key string, t time.Time) {
	w.mu.Lock()
	w.last[key] = t
	w.mu.Unlock()
}

// Prune drops keys whose period has passed, bounding memory.
func (w *Window) Prune() {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, t := range w.last {
		if now.Sub(t) >= w.period {
			delete(w.last, k)
		}
	}
}

// LogGate decides whether a verdict line is written: once per change of
// what is said about a key, and again after the relog interval if nothing
// changed, so an unchanged deferral repeating every tick is logged once.
// It is safe for concurrent use.
type LogGate struct {
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	logged map[string]logMark
}

// NewLogGate returns a gate that repeats an unchanged line after every
// (10 minutes when zero), on the clock now (time.Now when nil).
func NewLogGate(every time.Duration, now func() time.Time) *LogGate {
	if every == 0 {
		every = relogInterval
	}
	if now == nil {
		now = time.Now
	}
	return &LogGate{every: every, now: now, logged: map[string]logMark{}}
}

// Should reports whether what is new for key (or was last logged longer
// ago than the relog interval) and, if so, remembers it as logged.
func (g *LogGate) Should(key, what string) bool {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.logged[key]; ok && m.what == what && now.Sub(m.at) < g.every {
		return false
	}
	g.logged[key] = logMark{what: what, at: now}
	return true
}

// Forget drops key, so the next verdict about it is logged whatever it
// says (a session that recovered and fails again is news).
func (g *LogGate) Forget(key string) {
	g.mu.Lock()
	delete(g.logged, key)
	g.mu.Unlock()
}

// Prune drops marks older than the relog interval, bounding memory.
func (g *LogGate) Prune() {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, m := range g.logged {
		if now.Sub(m.at) >= g.every {
			delete(g.logged, k)
		}
	}
}

// RoundDuration keeps durations readable in reasons and log values: ms
// below a second, 0.1 s above.
func RoundDuration(d time.Duration) time.Duration { return round(d) }
