package monitor

import (
	"sync"
	"time"
)

// backoff spaces out connects to endpoints that did not answer: after the
// n-th consecutive failure an endpoint is skipped for base·2^(n-1), capped
// at max; one success resets it. An unreachable target is reported each
// tick but retried only when its backoff has run out, so a dead target
// costs one probe per backoff window, not one per tick.
type backoff struct {
	base, max time.Duration

	mu    sync.Mutex
	state map[string]backoffState
}

type backoffState struct {
	failures int
	until    time.Time
	lastErr  string
}

func newBackoff(base, max time.Duration) *backoff {
	return &backoff{base: base, max: max, state: map[string]backoffState{}}
}

// ready reports whether key may be tried at now, and if not, until when
// it waits and why.
func (b *backoff) ready(key string, now time.Time) (ok bool, until time.Time, lastErr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, found := b.state[key]
	if !found || !now.Before(s.until) {
		return true, time.Time{}, s.lastErr
	}
	return false, s.until, s.lastErr
}

// failure records a failed attempt at now and returns the next try time.
func (b *backoff) failure(key string, now time.Time, err error) time.Time {
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
	if err != nil {
		s.lastErr = err.Error()
	}
	b.state[key] = s
	return s.until
}

// success forgets key's failures.
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
