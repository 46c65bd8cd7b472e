package driver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// A call into the kernel that waits for a volume's I/O cannot be
// cancelled: an unmount flushing to a device without a path, a statfs or
// a filesystem grow waiting for a read sit in the kernel until the I/O
// completes or fails, whatever the caller's context says. pathmend decides
// before it starts such a call whether it would wait (stall.go: every
// path down and the filesystem mounted read-write), and starts none then.
// What still blocks — a path lost during the call — runs through
// kernelCalls: at most one call per volume, waited for at most a bound;
// past it the RPC answers Aborted naming the call and since when, and the
// call finishes on its own goroutine. Until it returns, every RPC that
// would act on the volume is answered Aborted at once (volumeLocks), so a
// retry never piles a second blocked call on the first and never holds
// the volume's slot: the goroutines left in the kernel are at most one
// per volume.

// kernelCalls runs the calls that may wait for a volume's I/O. Safe for
// concurrent use.
type kernelCalls struct {
	clock clock.Clock
	bound time.Duration

	mu sync.Mutex
	// running holds, by volume ID, the call in the kernel now.
	running map[string]kernelCall
}

// kernelCall is one call in the kernel: what it is and when it started.
type kernelCall struct {
	what    string
	started time.Time
}

func newKernelCalls(clk clock.Clock, bound time.Duration) *kernelCalls {
	return &kernelCalls{clock: clk, bound: bound, running: map[string]kernelCall{}}
}

// pendingError returns the Aborted error naming the call of volumeID still
// in the kernel, or nil when there is none.
func (k *kernelCalls) pendingError(volumeID string) error {
	k.mu.Lock()
	c, ok := k.running[volumeID]
	k.mu.Unlock()
	if !ok {
		return nil
	}
	return k.waitingError(volumeID, c)
}

func (k *kernelCalls) waitingError(volumeID string, c kernelCall) error {
	return &codedError{code: codes.Aborted, msg: fmt.Sprintf("volume %s: %s has been waiting in the kernel since %s (%s): it waits for the volume's I/O; nothing else is started on the volume until it returns",
		volumeID, c.what, c.started.UTC().Format(time.RFC3339), k.clock.Since(c.started).Round(time.Second))}
}

// run runs fn, a call into the kernel for volume volumeID described by
// what ("unmount of /var/lib/kubelet/…"), and returns its error when it
// returns within the bound and before ctx ends. Otherwise it returns an
// Aborted error naming the call, leaves fn running, and keeps the volume
// marked busy until fn returns. While a call of the volume runs, run
// starts nothing and answers Aborted.
func (k *kernelCalls) run(ctx context.Context, volumeID, what string, fn func() error) error {
	k.mu.Lock()
	if c, busy := k.running[volumeID]; busy {
		k.mu.Unlock()
		return k.waitingError(volumeID, c)
	}
	start := k.clock.Now()
	call := kernelCall{what: what, started: start}
	k.running[volumeID] = call
	k.mu.Unlock()

	done := make(chan callResult, 1)
	go func() {
		var r callResult
		defer func() {
			if x := recover(); x != nil {
				r.panicked, r.panic = true, x
			}
			k.mu.Lock()
			delete(k.running, volumeID)
			k.mu.Unlock()
			if took := k.clock.Since(start); took > k.bound {
				klog.InfoS("A kernel call that outlived its RPC returned", "volumeID", volumeID, "call", what, "after", took.Round(time.Millisecond), "err", r.err, "panicked", r.panicked)
			}
			done <- r
		}()
		r.err = fn()
	}()
	timer := k.clock.NewTimer(k.bound)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.result()
	case <-timer.C():
	case <-ctx.Done():
	}
	klog.InfoS("A kernel call is still waiting for the volume's I/O; answering without it", "volumeID", volumeID, "call", what, "waited", k.clock.Since(start).Round(time.Millisecond))
	select {
	case r := <-done: // returned meanwhile
		return r.result()
	default:
	}
	return k.waitingError(volumeID, call)
}

// callResult is how a kernel call ended: its error, or the panic it
// raised, which the waiting RPC raises again (a panic is the caller's to
// handle, not the helper goroutine's).
type callResult struct {
	err      error
	panicked bool
	panic    any
}

func (r callResult) result() error {
	if r.panicked {
		panic(r.panic)
	}
	return r.err
}

// pending counts the calls in the kernel now.
func (k *kernelCalls) pending() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.running)
}
