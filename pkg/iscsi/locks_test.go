package iscsi

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

// TestGate_RestartNeverWaitsAndCommandsWaitOnAChannel: a restart is
// refused while a command holds the gate; a command arriving during a
// restart is durably blocked until it ends, or gives up with its context.
func TestGate_RestartNeverWaitsAndCommandsWaitOnAChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g gate
		if err := g.enter(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, ok := g.tryExclusive(); ok {
			t.Fatal("restart admitted while a command runs")
		}
		g.leave()
		release, ok := g.tryExclusive()
		if !ok {
			t.Fatal("restart refused on an idle gate")
		}
		entered := make(chan error)
		go func() { entered <- g.enter(context.Background()) }()
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error)
		go func() { gaveUp <- g.enter(ctx) }()
		synctest.Wait() // both durably blocked
		select {
		case <-entered:
			t.Fatal("a command ran during a restart")
		default:
		}
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled command: %v", err)
		}
		release()
		if err := <-entered; err != nil {
			t.Fatal(err)
		}
		g.leave()
	})
}
