package uevent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Loss says why events were lost.
type Loss string

const (
	// LossSocket: the kernel found the socket's receive buffer full
	// (ENOBUFS) and dropped what did not fit.
	LossSocket Loss = "socket"
	// LossQueue: the queue was full: the consumer fell behind.
	LossQueue Loss = "queue"
	// LossTruncated: a message was larger than MaxMessage.
	LossTruncated Loss = "truncated"
	// LossMalformed: the kernel sent a message Parse refused, so what it
	// named is unknown.
	LossMalformed Loss = "malformed"
	// LossReceive: the socket returned an error other than an overflow,
	// or failed for good (the source stopped).
	LossReceive Loss = "receive"
)

// DefaultQueue is the default capacity of a Source's queue, in events.
const DefaultQueue = 1024

// Metrics counts what a Source receives and loses (pkg/metrics implements
// it; nil counts nothing).
type Metrics interface {
	// ObserveUevent counts one kernel uevent received, and whether the
	// filter kept it.
	ObserveUevent(subsystem string, kept bool)
	// ObserveUeventLoss counts one loss: events were lost for reason since
	// the consumer's last batch (counted once per reason and batch).
	ObserveUeventLoss(reason string)
}

// Config configures a Source; zero values take the defaults.
type Config struct {
	// Queue bounds the events held for the consumer (DefaultQueue).
	Queue int
	// Filter keeps the events the consumer wants (Relevant when nil).
	Filter func(Event) bool
	// Metrics, when set, counts events and losses.
	Metrics Metrics
	// Now stamps Event.Received (time.Now when nil).
	Now func() time.Time
}

// Batch is what a Source holds for its consumer: the events received
// since the last batch, in the kernel's order, and whether some were lost
// in between. An event is a hint: the consumer decides on a fresh read of
// the objects it names; after a loss it reads everything.
type Batch struct {
	Events []Event
	// Lost lists why events were lost since the last batch; empty when
	// none were. Events received after a loss are dropped until the batch
	// is taken: the full read the loss calls for covers them.
	Lost []Loss
}

// Source receives the kernel's uevents from a Conn in one goroutine
// (Run), keeps the ones its filter wants in a bounded queue, and hands
// them to its one consumer in batches. It never blocks the socket on the
// consumer: when the queue is full the new event is dropped and the loss
// reported in the next batch.
type Source struct {
	conn  Conn
	cfg   Config
	ready chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	queue []Event
	lost  []Loss
	err   error
}

// NewSource returns a source reading conn. Nothing is read before Run.
func NewSource(conn Conn, cfg Config) *Source {
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Filter == nil {
		cfg.Filter = Relevant
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Source{conn: conn, cfg: cfg, ready: make(chan struct{}, 1), done: make(chan struct{})}
}

// Run receives until ctx ends (it closes the Conn then, and returns nil)
// or the Conn fails for good (it returns the error, after reporting a
// LossReceive so the consumer reads everything once more). Call it once.
func (s *Source) Run(ctx context.Context) (err error) {
	stop := context.AfterFunc(ctx, func() { _ = s.conn.Close() })
	defer func() {
		stop()
		if ctx.Err() != nil {
			err = nil
		}
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		if err != nil {
			s.lose(LossReceive)
		}
		close(s.done)
	}()
	buf := make([]byte, MaxMessage+1)
	failures := 0
	for {
		n, kernel, err := s.conn.Recv(buf)
		switch {
		case err == nil:
			failures = 0
		case errors.Is(err, ErrOverflow):
			s.lose(LossSocket)
			continue
		case ctx.Err() != nil || errors.Is(err, os.ErrClosed):
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("uevent: socket closed: %w", err)
		default:
			// A receive error other than an overflow is not expected of a
			// netlink socket; a few in a row mean it is broken.
			failures++
			s.lose(LossReceive)
			if failures >= 10 {
				return fmt.Errorf("uevent: receive failed %d times in a row: %w", failures, err)
			}
			continue
		}
		if !kernel {
			continue // sent by a process, not the kernel
		}
		if n > MaxMessage {
			s.lose(LossTruncated)
			continue
		}
		e, perr := Parse(buf[:n])
		if perr != nil {
			klog.V(2).InfoS("Kernel uevent could not be parsed; reading everything again", "err", perr)
			s.lose(LossMalformed)
			continue
		}
		kept := s.cfg.Filter(e)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.ObserveUevent(e.Subsystem, kept)
		}
		if !kept {
			continue
		}
		e.Received = s.cfg.Now()
		s.push(e)
	}
}

// push queues e, or records a queue loss when the queue is full.
func (s *Source) push(e Event) {
	s.mu.Lock()
	switch {
	case len(s.lost) > 0:
		// A full read is due; it covers e.
	case len(s.queue) >= s.cfg.Queue:
		s.mu.Unlock()
		s.lose(LossQueue)
		return
	default:
		s.queue = append(s.queue, e)
	}
	s.mu.Unlock()
	s.signal()
}

// lose records a loss for the next batch and drops the queued events: the
// full read the loss calls for covers them.
func (s *Source) lose(why Loss) {
	s.mu.Lock()
	first := true
	for _, l := range s.lost {
		if l == why {
			first = false
		}
	}
	if first {
		s.lost = append(s.lost, why)
	}
	s.queue = nil
	s.mu.Unlock()
	if first && s.cfg.Metrics != nil {
		s.cfg.Metrics.ObserveUeventLoss(string(why))
	}
	s.signal()
}

func (s *Source) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Ready receives a value when a batch may be waiting (Take it); a
// consumer selects on it beside its other work.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// Done is closed when Run has returned; Err says why.
func (s *Source) Done() <-chan struct{} { return s.done }

// Err is Run's error once Done is closed: nil when its context ended.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Take returns the batch waiting, and empties it; a batch with no event
// and no loss when nothing is waiting.
func (s *Source) Take() Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := Batch{Events: s.queue, Lost: s.lost}
	s.queue, s.lost = nil, nil
	return b
}

// Next waits until a batch is waiting, or ctx ends, or the source stopped
// with nothing left to take (its error then, ErrStopped when it stopped
// cleanly).
func (s *Source) Next(ctx context.Context) (Batch, error) {
	for {
		if b := s.Take(); len(b.Events) > 0 || len(b.Lost) > 0 {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		case <-s.ready:
		case <-s.done:
			if b := s.Take(); len(b.Events) > 0 || len(b.Lost) > 0 {
				return b, nil
			}
			if err := s.Err(); err != nil {
				return Batch{}, err
			}
			return Batch{}, ErrStopped
		}
	}
}

// ErrStopped is returned by Next once Run returned because its context
// ended and every batch was taken.
var ErrStopped = errors.New("uevent: source stopped")
