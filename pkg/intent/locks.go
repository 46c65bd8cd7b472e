package intent

import (
	"context"
	"sync"
)

// KeyedLocks is one lock per key, made of channels so that a goroutine
// waiting for one is durably blocked on a channel (what a testing/synctest
// bubble and a deterministic scheduler can see), and gone from the map as
// soon as nobody holds or waits for it: memory is bounded by the keys in
// use. The map's mutex is held only to find or free an entry, never while
// waiting, so one key's holder never delays another key. The zero value is
// ready to use. The owner keys its target leases by volume.Target; the
// iSCSI initiator keys node records by string.
type KeyedLocks[K comparable] struct {
	mu sync.Mutex
	m  map[K]*keyLock
}

type keyLock struct {
	// slot holds a value while the lock is held.
	slot chan struct{}
	// refs counts the holder and the waiters; the entry is freed at 0.
	refs int
	// holder says who holds the lock, for "busy" notes.
	holder string
}

// ref finds or makes the entry of key and counts the caller in.
func (k *KeyedLocks[K]) ref(key K) *keyLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[K]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{slot: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	return l
}

// unref counts the caller out and frees the entry when it was the last.
func (k *KeyedLocks[K]) unref(key K, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.m, key)
	}
}

// Lock blocks until key's lock is free or ctx ends, takes it for holder
// and returns its release, which must be called exactly once.
func (k *KeyedLocks[K]) Lock(ctx context.Context, key K, holder string) (func(), error) {
	l := k.ref(key)
	select {
	case l.slot <- struct{}{}:
	case <-ctx.Done():
		k.unref(key, l)
		return nil, ctx.Err()
	}
	k.setHolder(l, holder)
	return k.release(key, l), nil
}

// TryLock takes key's lock for holder when it is free; otherwise it
// returns who holds it.
func (k *KeyedLocks[K]) TryLock(key K, holder string) (release func(), busy string) {
	l := k.ref(key)
	select {
	case l.slot <- struct{}{}:
		k.setHolder(l, holder)
		return k.release(key, l), ""
	default:
	}
	k.mu.Lock()
	busy = l.holder
	k.mu.Unlock()
	k.unref(key, l)
	if busy == "" {
		busy = "another operation" // taken a moment ago, holder not yet set
	}
	return nil, busy
}

func (k *KeyedLocks[K]) setHolder(l *keyLock, holder string) {
	k.mu.Lock()
	l.holder = holder
	k.mu.Unlock()
}

func (k *KeyedLocks[K]) release(key K, l *keyLock) func() {
	return func() {
		k.mu.Lock()
		l.holder = ""
		k.mu.Unlock()
		<-l.slot
		k.unref(key, l)
	}
}

// Len is the number of keys held or waited for.
func (k *KeyedLocks[K]) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
