package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/hack/lab/soak/block"
)

// Config is one worker's volume and pace.
type Config struct {
	// Volume names the volume; its blocks carry block.VolumeID(Volume).
	Volume string
	// Interval is the pause between two operations.
	Interval time.Duration
	// ReadEvery: every ReadEvery-th operation also reads back a random
	// other block (besides the read-back of every write).
	ReadEvery int
	// Stall is the duration from which one operation counts as a stall
	// (I/O queued while paths were down).
	Stall time.Duration
	// Seed seeds the choice of blocks.
	Seed uint64
	// Clock stamps events and paces Run.
	Clock clock.Clock
}

// Op names an operation in an event.
type Op string

const (
	OpWrite Op = "write"
	OpRead  Op = "read"
)

// Event is one I/O error, stall or verification finding, with the time
// the operation started and how long it took.
type Event struct {
	At    time.Time     `json:"at"`
	Took  time.Duration `json:"took"`
	Op    Op            `json:"op"`
	Block uint64        `json:"block"`
	// Err is the error of a failed operation; Detail what a verification
	// found.
	Err    string `json:"err,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Stats is what a worker did and saw.
type Stats struct {
	Writes, Reads         int
	WriteErrors           int
	ReadErrors            int
	Mismatches, Undefined int
	// Errors are the failed operations (the first maxEvents), Stalls the
	// slow ones, Findings the mismatches and undefined blocks.
	Errors, Stalls, Findings []Event
	// Dropped counts events past maxEvents per list.
	Dropped int
	// ReadOnly is when a write to the current device first failed with
	// EROFS (zero: never); ReadOnlyTimes every such first failure, one per
	// device the worker was given (a restage gives it a new one).
	ReadOnly      time.Time
	ReadOnlyTimes []time.Time
	// MaxOp is the slowest operation.
	MaxOp time.Duration
}

const maxEvents = 2000

// Worker writes self-describing blocks to one volume and reads them back,
// checking every read against its model. One goroutine runs it; the
// soak's driver pauses it around a restage and gives it the new device.
type Worker struct {
	cfg   Config
	vol   uint32
	model *Model
	rng   *rand.Rand
	buf   []byte
	gen   uint64
	ops   int

	mu    sync.Mutex // guards dev, stats, roSeen
	dev   Device
	stats Stats
	// roSeen: a write to the current device failed with EROFS.
	roSeen bool

	// opMu is held for one operation; Swap takes it to exchange devices
	// between operations.
	opMu sync.Mutex
}

// New returns a worker over dev, whose content it models from nothing:
// dev must be fresh (all zero) or hold only this worker's earlier writes.
func New(cfg Config, dev Device) *Worker {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ReadEvery <= 0 {
		cfg.ReadEvery = 4
	}
	vol := block.VolumeID(cfg.Volume)
	return &Worker{
		cfg: cfg, vol: vol, dev: dev,
		model: NewModel(vol, dev.Blocks()),
		rng:   rand.New(rand.NewPCG(cfg.Seed, uint64(vol))),
		buf:   Aligned(),
	}
}

// Stats returns a copy of what the worker saw so far.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Errors = append([]Event(nil), s.Errors...)
	s.Stalls = append([]Event(nil), s.Stalls...)
	s.Findings = append([]Event(nil), s.Findings...)
	s.ReadOnlyTimes = append([]time.Time(nil), s.ReadOnlyTimes...)
	return s
}

// Run does operations until ctx ends, one every Interval.
func (w *Worker) Run(ctx context.Context) {
	for ctx.Err() == nil {
		w.Step()
		select {
		case <-ctx.Done():
		case <-w.cfg.Clock.After(w.cfg.Interval):
		}
	}
}

// Step does one operation: write a random block with the next
// generation and read it back; every ReadEvery-th step read another
// random block too. Without a device (paused) it does nothing.
func (w *Worker) Step() {
	w.opMu.Lock()
	defer w.opMu.Unlock()
	w.mu.Lock()
	dev := w.dev
	w.mu.Unlock()
	if dev == nil {
		return
	}
	w.ops++
	i := w.rng.Uint64N(w.model.Blocks())
	w.gen++
	if w.write(dev, i, w.gen) == nil {
		w.read(dev, i)
	}
	if w.ops%w.cfg.ReadEvery == 0 {
		w.read(dev, w.rng.Uint64N(w.model.Blocks()))
	}
}

func (w *Worker) write(dev Device, i, gen uint64) error {
	start := w.cfg.Clock.Now()
	block.Fill(w.buf, w.vol, i, gen, start)
	err := dev.WriteBlock(i, w.buf)
	took := w.cfg.Clock.Since(start)
	w.model.Wrote(i, gen, err)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stats.Writes++
	w.timed(OpWrite, i, start, took)
	if err != nil {
		w.stats.WriteErrors++
		w.add(&w.stats.Errors, Event{At: start, Took: took, Op: OpWrite, Block: i, Err: err.Error()})
		if errors.Is(err, syscall.EROFS) && !w.roSeen {
			w.roSeen = true
			w.stats.ReadOnly = start
			w.stats.ReadOnlyTimes = append(w.stats.ReadOnlyTimes, start)
		}
	}
	return err
}

// read reads block i and checks it against the model.
func (w *Worker) read(dev Device, i uint64) (Verdict, error) {
	start := w.cfg.Clock.Now()
	err := dev.ReadBlock(i, w.buf)
	took := w.cfg.Clock.Since(start)
	var v Verdict
	var detail string
	if err == nil {
		v, detail = w.model.Check(i, w.buf)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stats.Reads++
	w.timed(OpRead, i, start, took)
	switch {
	case err != nil:
		w.stats.ReadErrors++
		w.add(&w.stats.Errors, Event{At: start, Took: took, Op: OpRead, Block: i, Err: err.Error()})
	case v == Mismatch:
		w.stats.Mismatches++
		w.add(&w.stats.Findings, Event{At: start, Took: took, Op: OpRead, Block: i, Detail: v.String() + ": " + detail})
	case v == Undefined:
		w.stats.Undefined++
		w.add(&w.stats.Findings, Event{At: start, Took: took, Op: OpRead, Block: i, Detail: v.String() + ": " + detail})
	}
	return v, err
}

// timed records a stall and the slowest operation. w.mu is held.
func (w *Worker) timed(op Op, i uint64, start time.Time, took time.Duration) {
	if took > w.stats.MaxOp {
		w.stats.MaxOp = took
	}
	if w.cfg.Stall > 0 && took >= w.cfg.Stall {
		w.add(&w.stats.Stalls, Event{At: start, Took: took, Op: op, Block: i})
	}
}

func (w *Worker) add(list *[]Event, e Event) {
	if len(*list) >= maxEvents {
		w.stats.Dropped++
		return
	}
	*list = append(*list, e)
}

// Swap exchanges the device between two operations and returns the old
// one; nil pauses the worker. It waits for an operation in progress,
// at most until ctx ends (an operation can hang while every path is
// down).
func (w *Worker) Swap(ctx context.Context, dev Device) (Device, error) {
	locked := make(chan struct{})
	go func() { w.opMu.Lock(); close(locked) }()
	select {
	case <-locked:
	case <-ctx.Done():
		go func() { <-locked; w.opMu.Unlock() }()
		return nil, fmt.Errorf("an operation on %s did not finish: %w", w.cfg.Volume, ctx.Err())
	}
	defer w.opMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.dev
	w.dev = dev
	if dev != nil {
		w.roSeen = false
	}
	if dev != nil && dev.Blocks() != w.model.Blocks() {
		return old, fmt.Errorf("new device of %s has %d blocks, the model %d", w.cfg.Volume, dev.Blocks(), w.model.Blocks())
	}
	return old, nil
}

// VerifyAll reads every block of the current device and checks it;
// it returns how many were read, intact, undefined and mismatched. The
// worker must be between operations (it takes the operation lock).
func (w *Worker) VerifyAll(ctx context.Context) (read, mismatched, undefined int, err error) {
	w.opMu.Lock()
	defer w.opMu.Unlock()
	w.mu.Lock()
	dev := w.dev
	w.mu.Unlock()
	if dev == nil {
		return 0, 0, 0, errors.New("no device")
	}
	for i := range w.model.Blocks() {
		if ctx.Err() != nil {
			return read, mismatched, undefined, ctx.Err()
		}
		v, rerr := w.read(dev, i)
		read++
		switch {
		case rerr != nil:
			if err == nil {
				err = fmt.Errorf("read block %d: %w", i, rerr)
			}
		case v == Mismatch:
			mismatched++
		case v == Undefined:
			undefined++
		}
	}
	return read, mismatched, undefined, err
}
