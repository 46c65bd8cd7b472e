package monitor

import (
	"sync"
	"time"
)

// backoff spaces out reconnects of endpoints whose attempts are costly:
// a probe that got no answer (it waits its whole timeout) and a kernel
// connect that failed after the endpoint answered the probe. After the
// n-th consecutive such failure an endpoint waits base·2^(n-1), capped at
// max; one success resets it.
//
// A refusal is not backed off: an endpoint that answers with a reset costs
// one round trip, and a port that comes back must be reconnected on the
// next tick, not when a backoff grown during the outage runs out. And an
// endpoint backed off because it did not answer is still rechecked every
// tick with a short probe (silent: the monitor's recheck), so one that
// answers again is reconnected at once; only the full attempt waits.
type backoff struct {
	base, max time.Duration

	mu    sync.Mutex
	state map[string]backoffState
}

type backoffState struct {
	failures int
	until    time.Time
	lastErr  string
	// recheck is set when the last failure was a probe without an answer:
	// a short probe each tick may end the wait early.
	recheck bool
}

func newBackoff(base, max time.Duration) *backoff {
	return &backoff{base: base, max: max, state: map[string]backoffState{}}
}

// ready reports whether key may be tried at now; if not, until when it
// waits, why, and whether a short probe that is answered may end the wait.
func (b *backoff) ready(key string, now time.Time) (ok bool, until time.Time, lastErr string, recheck bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, found := b.state[key]
	if !found || !now.Before(s.until) {
		return true, time.Time{}, s.lastErr, false
	}
	return false, s.until, s.lastErr, s.recheck
}

// failure records a costly failed attempt at now and returns the next try
// time. recheck says the endpoint did not answer its probe.
func (b *backoff) failure(key string, now time.Time, err error, recheck bool) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.state[key]
	s.failures++
	d := b.base
	for i := 1; i < s.failures && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	s.until = now.Add(d)
	s.recheck = recheck
	if err != nil {
		s.lastErr = err.Error()
	}
	b.state[key] = s
	return s.until
}

// success forgets key's failures. A refusal forgets them too: the
// endpoint answers again, and the next tick tries it.
func (b *backoff) success(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.state, key)
}

// prune forgets keys not in keep (endpoints no staged volume lists any
// more), so memory stays bounded by the endpoints in use.
func (b *backoff) prune(keep map[string]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.state {
		if !keep[k] {
			delete(b.state, k)
		}
	}
}

// len is the number of endpoints backed off, for tests and metrics.
func (b *backoff) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.state)
}
