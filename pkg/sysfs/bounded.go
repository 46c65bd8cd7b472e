package sysfs

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ErrWriteTimedOut is wrapped by a BoundedWriter's error for a write the
// kernel had not returned from by the deadline, and for a write to an
// attribute whose earlier write still has not returned.
var ErrWriteTimedOut = errors.New("kernel write did not return in time")

// DefaultWriteTimeout bounds a kernel write when the caller sets no
// bound. A controller delete or a rescan returns within seconds on a
// working kernel; one still blocked after a minute is wedged (seen on
// Debian's 6.1: a controller left resetting for good by an nvme-tcp oops
// blocks its delete_controller for ever).
const DefaultWriteTimeout = time.Minute

// BoundedWriter writes kernel attributes that can block (a controller's
// delete_controller and rescan_controller, a SCSI device's delete and
// rescan, a host's scan) with a deadline, so that a wedged kernel object
// cannot hang a NodeUnstage or a monitor job for ever. The write runs on
// its own goroutine; past the deadline the caller gets ErrWriteTimedOut
// and the goroutine stays in the kernel until the kernel returns (a
// write into sysfs cannot be interrupted). While it is there, another
// write to the same attribute fails at once with ErrWriteTimedOut: a
// retried RPC or the next tick does not pile up blocked goroutines.
// Safe for concurrent use.
type BoundedWriter struct {
	write   func(rel, value string) error
	clock   clock.Clock
	timeout time.Duration

	mu sync.Mutex
	// blocked holds the attributes whose write has not returned, with
	// the time it started.
	blocked map[string]time.Time
}

// NewBoundedWriter bounds write (FS.WriteAttr, or a fake's) by timeout
// (DefaultWriteTimeout when not positive), timed by clk.
func NewBoundedWriter(write func(rel, value string) error, clk clock.Clock, timeout time.Duration) *BoundedWriter {
	if timeout <= 0 {
		timeout = DefaultWriteTimeout
	}
	return &BoundedWriter{write: write, clock: clk, timeout: timeout, blocked: map[string]time.Time{}}
}

// WriteAttr writes value to rel and returns the write's error, or an
// error wrapping ErrWriteTimedOut when the write did not return within
// the timeout or an earlier write to rel still has not.
func (w *BoundedWriter) WriteAttr(rel, value string) error {
	w.mu.Lock()
	if since, ok := w.blocked[rel]; ok {
		w.mu.Unlock()
		return fmt.Errorf("write %s: %w: an earlier write has been blocked in the kernel since %s", rel, ErrWriteTimedOut, since.Format(time.RFC3339))
	}
	start := w.clock.Now()
	w.blocked[rel] = start
	w.mu.Unlock()

	done := make(chan error, 1)
	go func() {
		err := w.write(rel, value)
		w.mu.Lock()
		delete(w.blocked, rel)
		w.mu.Unlock()
		if waited := w.clock.Since(start); waited > w.timeout {
			klog.InfoS("A timed-out kernel write returned", "attribute", rel, "after", waited.Round(time.Millisecond), "err", err)
		}
		done <- err
	}()
	timer := w.clock.NewTimer(w.timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C():
		err := fmt.Errorf("write %s: %w (%s): the kernel object is wedged; pathmend does not wait for it", rel, ErrWriteTimedOut, w.timeout)
		klog.ErrorS(err, "Kernel write blocked", "attribute", rel, "timeout", w.timeout)
		return err
	}
}
