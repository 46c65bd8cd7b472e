package uevent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// counts is a uevent.Metrics that remembers what it was told.
type counts struct {
	mu     sync.Mutex
	kept   map[string]int
	ignore map[string]int
	losses map[string]int
}

func newCounts() *counts {
	return &counts{kept: map[string]int{}, ignore: map[string]int{}, losses: map[string]int{}}
}

func (c *counts) ObserveUevent(subsystem string, kept bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if kept {
		c.kept[subsystem]++
	} else {
		c.ignore[subsystem]++
	}
}

func (c *counts) ObserveUeventLoss(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.losses[reason]++
}

func ev(seq uint64, action uevent.Action, devpath, subsystem string, kv ...string) uevent.Event {
	env := map[string]string{"ACTION": string(action), "DEVPATH": devpath, "SUBSYSTEM": subsystem, "SEQNUM": fmt.Sprint(seq)}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return uevent.Event{Seq: seq, Action: action, DevPath: devpath, Subsystem: subsystem, Env: env}
}

var (
	ctrlRemove = ev(10, uevent.Remove, "/devices/virtual/nvme-fabrics/ctl/nvme1", "nvme", "NVME_TRTYPE", "tcp")
	loopEvent  = ev(11, uevent.Change, "/devices/virtual/block/loop0", "block", "DEVTYPE", "disk")
	headAdd    = ev(12, uevent.Add, "/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n2", "block", "DEVTYPE", "disk")
)

// run starts src in the bubble and returns a stop that ends it and waits.
func run(t *testing.T, src *uevent.Source) (stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

func seqs(b uevent.Batch) []uint64 {
	var out []uint64
	for _, e := range b.Events {
		out = append(out, e.Seq)
	}
	return out
}

func TestSource_DeliversTheRelevantEventsInOrderInOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		m := newCounts()
		src := uevent.NewSource(conn, uevent.Config{Metrics: m})
		stop := run(t, src)
		conn.SendEvent(ctrlRemove)
		conn.SendEvent(loopEvent)
		conn.SendEvent(headAdd)
		synctest.Wait()
		b, err := src.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := seqs(b); !slices.Equal(got, []uint64{10, 12}) || len(b.Lost) > 0 {
			t.Errorf("batch = %v lost %v, want [10 12] and no loss", got, b.Lost)
		}
		if b.Events[0].Received.IsZero() {
			t.Error("Received not stamped")
		}
		if m.kept["nvme"] != 1 || m.kept["block"] != 1 || m.ignore["block"] != 1 {
			t.Errorf("counted kept %v ignored %v", m.kept, m.ignore)
		}
		if err := stop(); err != nil {
			t.Errorf("Run after its context ended = %v, want nil", err)
		}
		if _, err := src.Next(t.Context()); !errors.Is(err, uevent.ErrStopped) {
			t.Errorf("Next after Run = %v, want ErrStopped", err)
		}
	})
}

func TestSource_IgnoresWhatAProcessSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		src := uevent.NewSource(conn, uevent.Config{})
		stop := run(t, src)
		conn.Send(uevent.Encode(ctrlRemove), false)
		synctest.Wait()
		if b := src.Take(); len(b.Events)+len(b.Lost) != 0 {
			t.Errorf("a message not from the kernel was delivered: %+v", b)
		}
		stop()
	})
}

func TestSource_ASocketOverflowDropsTheQueueAndAsksForAFullRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		m := newCounts()
		src := uevent.NewSource(conn, uevent.Config{Metrics: m})
		stop := run(t, src)
		conn.SendEvent(ctrlRemove)
		conn.Overflow()
		conn.SendEvent(headAdd) // after the loss, before the batch is taken: covered by the full read
		conn.Overflow()         // the same loss, counted once per batch
		synctest.Wait()
		b := src.Take()
		if len(b.Events) != 0 || !slices.Equal(b.Lost, []uevent.Loss{uevent.LossSocket}) {
			t.Errorf("batch = %v lost %v, want no event and lost [socket]", seqs(b), b.Lost)
		}
		if m.losses["socket"] != 1 {
			t.Errorf("losses counted %v, want socket 1", m.losses)
		}
		conn.SendEvent(headAdd)
		synctest.Wait()
		if b := src.Take(); !slices.Equal(seqs(b), []uint64{12}) || len(b.Lost) > 0 {
			t.Errorf("after the batch: %v lost %v, want [12]", seqs(b), b.Lost)
		}
		stop()
	})
}

func TestSource_AFullQueueIsALossNotABlockedSocket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		m := newCounts()
		src := uevent.NewSource(conn, uevent.Config{Queue: 3, Metrics: m})
		stop := run(t, src)
		for i := range 10 {
			e := ctrlRemove
			e.Seq = uint64(100 + i)
			e.Env = map[string]string{"ACTION": "remove", "DEVPATH": e.DevPath, "SUBSYSTEM": "nvme", "SEQNUM": fmt.Sprint(e.Seq)}
			conn.SendEvent(e)
		}
		synctest.Wait()
		if conn.Pending() != 0 {
			t.Fatalf("the socket was not drained: %d pending", conn.Pending())
		}
		b := src.Take()
		if len(b.Events) != 0 || !slices.Equal(b.Lost, []uevent.Loss{uevent.LossQueue}) || m.losses["queue"] != 1 {
			t.Errorf("batch = %v lost %v (counted %v), want lost [queue] once", seqs(b), b.Lost, m.losses)
		}
		stop()
	})
}

func TestSource_TruncatedAndMalformedMessagesAreLosses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		src := uevent.NewSource(conn, uevent.Config{})
		stop := run(t, src)
		conn.Send(make([]byte, uevent.MaxMessage+100), true)
		conn.Send([]byte("add@/x\x00garbage\x00"), true)
		synctest.Wait()
		b := src.Take()
		if !slices.Equal(b.Lost, []uevent.Loss{uevent.LossTruncated, uevent.LossMalformed}) {
			t.Errorf("lost %v, want [truncated malformed]", b.Lost)
		}
		stop()
	})
}

func TestSource_StopsOnABrokenSocketAndAsksForAFullRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		src := uevent.NewSource(conn, uevent.Config{})
		done := make(chan error, 1)
		go func() { done <- src.Run(t.Context()) }()
		broken := errors.New("EBADF")
		for range 10 {
			conn.Fail(broken)
		}
		err := <-done
		if !errors.Is(err, broken) {
			t.Fatalf("Run = %v, want the receive error", err)
		}
		b, nerr := src.Next(t.Context())
		if nerr != nil || !slices.Contains(b.Lost, uevent.LossReceive) {
			t.Errorf("Next = %+v, %v; want a batch lost for receive", b, nerr)
		}
		if _, nerr := src.Next(t.Context()); !errors.Is(nerr, broken) {
			t.Errorf("Next once drained = %v, want Run's error", nerr)
		}
		select {
		case <-src.Done():
		default:
			t.Error("Done not closed")
		}
	})
}

func TestSource_NextWaitsForABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := ueventtest.NewConn()
		src := uevent.NewSource(conn, uevent.Config{})
		stop := run(t, src)
		got := make(chan uevent.Batch, 1)
		go func() {
			b, _ := src.Next(t.Context())
			got <- b
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case b := <-got:
			t.Fatalf("Next returned %+v with nothing sent", b)
		default:
		}
		conn.SendEvent(headAdd)
		if b := <-got; !slices.Equal(seqs(b), []uint64{12}) {
			t.Errorf("Next = %v, want [12]", seqs(b))
		}
		stop()
	})
}
