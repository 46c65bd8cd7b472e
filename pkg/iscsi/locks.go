package iscsi

import (
	"context"
	"sync"
)

// gate is held shared by every login, logout and node-record command and
// exclusively by a restart of iscsid. A restart never waits: it is refused
// while a shared holder runs. A shared holder waits while a restart runs,
// on a channel (durably blocked, for a deterministic scheduler), giving up
// when its context ends.
type gate struct {
	mu         sync.Mutex
	shared     int
	restarting chan struct{} // non-nil while a restart runs; closed when it ends
}

// enter takes the gate shared, waiting while a restart runs.
func (g *gate) enter(ctx context.Context) error {
	g.mu.Lock()
	for g.restarting != nil {
		done := g.restarting
		g.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
	g.shared++
	g.mu.Unlock()
	return nil
}

// leave releases a shared hold.
func (g *gate) leave() {
	g.mu.Lock()
	g.shared--
	g.mu.Unlock()
}

// tryExclusive takes the gate exclusively when nothing holds it, and
// returns its release; ok is false otherwise.
func (g *gate) tryExclusive() (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shared > 0 || g.restarting != nil {
		return nil, false
	}
	done := make(chan struct{})
	g.restarting = done
	return func() {
		g.mu.Lock()
		g.restarting = nil
		g.mu.Unlock()
		close(done)
	}, true
}
