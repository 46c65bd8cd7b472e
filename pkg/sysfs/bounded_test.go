package sysfs

import (
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// blockingKernel is a write that blocks on one attribute until released,
// as delete_controller does on a controller left resetting for good.
type blockingKernel struct {
	wedged  string
	release chan struct{}

	mu     sync.Mutex
	writes []string
}

func (k *blockingKernel) write(rel, value string) error {
	k.mu.Lock()
	k.writes = append(k.writes, rel+"="+value)
	k.mu.Unlock()
	if rel == k.wedged {
		<-k.release
	}
	return nil
}

func (k *blockingKernel) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.writes)
}

// TestBoundedWriter_AWedgedWriteTimesOutAndIsNotRepeated: a write the
// kernel does not return from is answered ErrWriteTimedOut at the
// deadline; another write to that attribute fails at once without a
// second goroutine entering the kernel; other attributes are written as
// usual; once the kernel returns, the attribute can be written again.
func TestBoundedWriter_AWedgedWriteTimesOutAndIsNotRepeated(t *testing.T) {
	const wedged = "class/nvme/nvme3/delete_controller"
	k := &blockingKernel{wedged: wedged, release: make(chan struct{})}
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC))
	w := NewBoundedWriter(k.write, clk, 30*time.Second)

	done := make(chan error, 1)
	go func() { done <- w.WriteAttr(wedged, "1") }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(29 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("returned before the deadline: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Step(time.Second)
	if err := <-done; !errors.Is(err, ErrWriteTimedOut) {
		t.Fatalf("wedged write: %v, want ErrWriteTimedOut", err)
	}

	if err := w.WriteAttr(wedged, "1"); !errors.Is(err, ErrWriteTimedOut) {
		t.Errorf("second write while the first is blocked: %v, want ErrWriteTimedOut at once", err)
	}
	if n := k.count(); n != 1 {
		t.Errorf("the kernel saw %d writes to the wedged attribute, want 1", n)
	}
	if err := w.WriteAttr("class/nvme/nvme4/rescan_controller", "1"); err != nil {
		t.Errorf("write to another attribute: %v", err)
	}

	close(k.release)
	for {
		err := w.WriteAttr(wedged, "1")
		if err == nil {
			break
		}
		if !errors.Is(err, ErrWriteTimedOut) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // the first write's goroutine is returning
	}
}

// TestBoundedWriter_ReturnsTheWritesError: a write that returns in time
// returns its own error.
func TestBoundedWriter_ReturnsTheWritesError(t *testing.T) {
	boom := errors.New("no such device")
	w := NewBoundedWriter(func(string, string) error { return boom }, clocktesting.NewFakeClock(time.Now()), 0)
	if err := w.WriteAttr("class/nvme/nvme0/rescan_controller", "1"); !errors.Is(err, boom) {
		t.Errorf("got %v, want %v", err, boom)
	}
}
