package intent

import (
	"context"
	"sync"

	"github.com/pathmend/pathmend/pkg/volume"
)

// targetLocks is one lock per target, made of channels so that a
// goroutine waiting for one is durably blocked on a channel (what a
// testing/synctest bubble and a deterministic scheduler can see), and
// gone from the map as soon as nobody holds or waits for it: memory is
// bounded by the targets in use. The map's mutex is held only to find
// or free an entry, never while waiting, so one target's holder never
// delays another target.
type targetLocks struct {
	mu sync.Mutex
	m  map[volume.Target]*targetLock
}

type targetLock struct {
	// slot holds a value while the lock is held.
	slot chan struct{}
	// refs counts the holder and the waiters; the entry is freed at 0.
	refs int
	// holder says who holds the lock, for "busy" notes.
	holder string
}

// ref finds or makes the entry of t and counts the caller in.
func (k *targetLocks) ref(t volume.Target) *targetLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[volume.Target]*targetLock{}
	}
	l := k.m[t]
	if l == nil {
		l = &targetLock{slot: make(chan struct{}, 1)}
		k.m[t] = l
	}
	l.refs++
	return l
}

// unref counts the caller out and frees the entry when it was the last.
func (k *targetLocks) unref(t volume.Target, l *targetLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.m, t)
	}
}

// lock blocks until t's lock is free or ctx ends, takes it and returns
// its release, which must be called exactly once.
func (k *targetLocks) lock(ctx context.Context, t volume.Target, holder string) (func(), error) {
	l := k.ref(t)
	select {
	case l.slot <- struct{}{}:
	case <-ctx.Done():
		k.unref(t, l)
		return nil, ctx.Err()
	}
	k.setHolder(l, holder)
	return k.release(t, l), nil
}

// tryLock takes t's lock when it is free; otherwise it returns who holds
// it.
func (k *targetLocks) tryLock(t volume.Target, holder string) (release func(), busy string) {
	l := k.ref(t)
	select {
	case l.slot <- struct{}{}:
		k.setHolder(l, holder)
		return k.release(t, l), ""
	default:
	}
	k.mu.Lock()
	busy = l.holder
	k.mu.Unlock()
	k.unref(t, l)
	if busy == "" {
		busy = "another operation" // taken a moment ago, holder not yet set
	}
	return nil, busy
}

func (k *targetLocks) setHolder(l *targetLock, holder string) {
	k.mu.Lock()
	l.holder = holder
	k.mu.Unlock()
}

func (k *targetLocks) release(t volume.Target, l *targetLock) func() {
	return func() {
		k.mu.Lock()
		l.holder = ""
		k.mu.Unlock()
		<-l.slot
		k.unref(t, l)
	}
}

// size is the number of targets held or waited for, for tests.
func (k *targetLocks) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
