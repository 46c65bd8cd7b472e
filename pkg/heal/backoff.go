package heal

import (
	"sync"
	"time"
)

// Backoff spaces out the retries of keys whose attempts are costly — for
// the NVMe transport, reconnects of an endpoint ("nqn host:port"): a
// probe that got no answer (it waits its whole timeout) and a kernel
// connect that failed after the endpoint answered the probe. After the
// n-th consecutive such failure a key waits base·2^(n-1), capped at max;
// one success resets it. It is the one per-key backoff of the process:
// the loop's jobs share it whatever scope a target is in.
//
// A refusal is not backed off (the caller calls Success): an endpoint
// that answers with a reset costs one round trip, and a port that comes
// back must be reconnected on the next tick, not when a backoff grown
// during the outage runs out. A key backed off because it did not answer
// is marked for a recheck: the caller may end its wait early with a short
// probe each tick; only the full attempt waits.
//
// A Backoff is safe for concurrent use.
type Backoff struct {
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

// NewBackoff returns a Backoff that waits base after the first failure,
// doubling up to max.
func NewBackoff(base, max time.Duration) *Backoff {
	return &Backoff{base: base, max: max, state: map[string]backoffState{}}
}

// Ready reports whether key may be tried at now; if not, until when it
// waits, why (the last failure's error), and whether a short probe that
// is answered may end the wait.
func (b *Backoff) Ready(key string, now time.Time) (ok bool, until time.Time, lastErr string, recheck bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, found := b.state[key]
	if !found || !now.Before(s.until) {
		return true, time.Time{}, s.lastErr, false
	}
	return false, s.until, s.lastErr, s.recheck
}

// Failure records a costly failed attempt at now and returns the next try
// time. recheck says the key did not answer its probe.
func (b *Backoff) Failure(key string, now time.Time, err error, recheck bool) time.Time {
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

// Success forgets key's failures. A refusal forgets them too: the
// endpoint answers again, and the next tick tries it.
func (b *Backoff) Success(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.state, key)
}

// Prune forgets the keys keep does not hold (endpoints nothing lists any
// more), so memory stays bounded by the keys in use.
func (b *Backoff) Prune(keep func(key string) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.state {
		if !keep(k) {
			delete(b.state, k)
		}
	}
}

// Len is the number of keys backed off.
func (b *Backoff) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.state)
}
