package nodesim

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// Kernel events. The fake NVMe kernel and the fake iSCSI host announce
// every change as the lab's 6.1 kernel does (nvmetest.Uevents,
// iscsitest's announcer; docs/uevents.md), pathmend's own changes
// included. The events wait in the process's socket (pending) until the
// scheduler delivers them to the loop, one batch at a time, as an actor
// of the loop (never beside a tick: the loop is one goroutine), whose
// jobs park at the same seams as a tick's. Delivery is a seam of its own:
// the scheduler delivers every pending event, or only the oldest ones
// (the rest later), or loses them all with the loss reported (a socket
// overflow, a full queue: the loop reads everything), or drops one
// without a word (what no event announces: the tick must find it). A
// crash loses whatever the dead process's socket held; a new process
// hears only what the kernel announces after it starts.

// deliverEvents takes one delivery decision, when the loop is idle and
// it has events to deliver or a deferred decision has fallen due.
func (s *sim) deliverEvents() {
	s.collectEvents()
	due := s.proc.mon.NextDue()
	if len(s.pending) == 0 && (due.IsZero() || due.After(s.clk.Now())) {
		return
	}
	var b uevent.Batch
	what := "due"
	switch x := s.rng.IntN(10); {
	case len(s.pending) == 0:
	case x < 6:
		b.Events, s.pending = s.pending, nil
		what = "all"
	case x < 8:
		n := 1 + s.rng.IntN(len(s.pending))
		b.Events, s.pending = slices.Clone(s.pending[:n]), slices.Clone(s.pending[n:])
		what = fmt.Sprintf("oldest %d", n)
	case x < 9:
		b.Lost = []uevent.Loss{[]uevent.Loss{uevent.LossSocket, uevent.LossQueue}[s.rng.IntN(2)]}
		what = fmt.Sprintf("lost %d (%s)", len(s.pending), b.Lost[0])
		s.stats.event("lost", len(s.pending))
		s.pending = nil
	default:
		i := s.rng.IntN(len(s.pending))
		what = "dropped " + s.pending[i].String()
		s.stats.event("dropped", 1)
		b.Events, s.pending = slices.Delete(s.pending, i, i+1), nil
	}
	s.deliver(b, what)
}

// deliverAll delivers every pending event (quiescence).
func (s *sim) deliverAll() {
	s.collectEvents()
	if len(s.pending) > 0 && !s.ticking {
		b := uevent.Batch{Events: s.pending}
		s.pending = nil
		s.deliver(b, "all")
	}
}

func (s *sim) deliver(b uevent.Batch, what string) {
	names := make([]string, len(b.Events))
	for i := range b.Events {
		b.Events[i].Received = s.clk.Now()
		names[i] = b.Events[i].String()
	}
	s.stats.event("delivered", len(b.Events))
	s.logf("EVENTS %s: %s", what, strings.Join(names, ", "))
	s.ticking = true
	s.spawn(nil, "events", func(p *process) error {
		rep := p.mon.HandleEvents(context.Background(), b)
		for _, d := range rep.Decisions {
			if d.Started {
				s.stats.event("jobs", 1)
			}
		}
		s.stats.event("decisions", len(rep.Decisions))
		if rep.Full {
			s.stats.event("full reads", 1)
		}
		return nil
	})
}

// collectEvents moves what the kernel and the host announced into the
// process's socket.
func (s *sim) collectEvents() {
	s.pending = append(s.pending, s.kernel.TakeUevents()...)
	s.pending = append(s.pending, s.host.TakeUevents()...)
}

// forgetEvents is a new process: nothing announced before it started
// reaches it.
func (s *sim) forgetEvents() {
	s.kernel.TakeUevents()
	s.host.TakeUevents()
	s.pending = nil
}
