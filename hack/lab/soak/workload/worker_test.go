package workload

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/hack/lab/soak/block"
)

// memDev is a device in memory whose writes can be made to fail, to
// land anyway, to tear, or to be lost after they were acknowledged.
type memDev struct {
	blocks [][]byte
	// failNext makes the next writes fail: "drop" (nothing reaches the
	// medium), "land" (the data reaches it anyway), "tear" (half of it
	// does), "erofs" (read-only filesystem).
	failNext []string
	// slow makes the next operation take this long on the clock.
	slow  time.Duration
	clock *clocktesting.FakeClock
}

func newMemDev(n int, clk *clocktesting.FakeClock) *memDev {
	d := &memDev{clock: clk}
	for range n {
		d.blocks = append(d.blocks, make([]byte, block.Size))
	}
	return d
}

func (d *memDev) WriteBlock(i uint64, buf []byte) error {
	if d.slow > 0 {
		d.clock.Step(d.slow)
		d.slow = 0
	}
	if len(d.failNext) > 0 {
		mode := d.failNext[0]
		d.failNext = d.failNext[1:]
		switch mode {
		case "land":
			copy(d.blocks[i], buf)
		case "tear":
			copy(d.blocks[i][:block.Size/2], buf[:block.Size/2])
		case "erofs":
			return &os.PathError{Op: "write", Path: "f", Err: syscall.EROFS}
		}
		return syscall.EIO
	}
	copy(d.blocks[i], buf)
	return nil
}

func (d *memDev) ReadBlock(i uint64, buf []byte) error { copy(buf, d.blocks[i]); return nil }
func (d *memDev) Blocks() uint64                       { return uint64(len(d.blocks)) }
func (d *memDev) Close() error                         { return nil }

func newWorker(t *testing.T, n int) (*Worker, *memDev, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 0))
	dev := newMemDev(n, clk)
	w := New(Config{Volume: "v", ReadEvery: 1, Stall: time.Second, Seed: 1, Clock: clk}, dev)
	return w, dev, clk
}

func TestWorker_CleanRunFindsEverythingIntact(t *testing.T) {
	w, _, _ := newWorker(t, 16)
	for range 200 {
		w.Step()
	}
	read, bad, undef, err := w.VerifyAll(context.Background())
	if err != nil || read != 16 || bad != 0 || undef != 0 {
		t.Fatalf("VerifyAll: read %d, mismatched %d, undefined %d, %v", read, bad, undef, err)
	}
	s := w.Stats()
	if s.Writes != 200 || s.WriteErrors != 0 || s.Mismatches != 0 || len(s.Errors) != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A failed write may land, not land or tear: none of these is a loss,
// and the verifier says which it was.
func TestWorker_FailedWritesAreUndefinedNotLost(t *testing.T) {
	for _, mode := range []string{"drop", "land", "tear"} {
		t.Run(mode, func(t *testing.T) {
			w, dev, _ := newWorker(t, 1)
			w.Step() // generation 1 acknowledged
			dev.failNext = []string{mode}
			w.Step() // generation 2 fails
			_, bad, undef, err := w.VerifyAll(context.Background())
			if err != nil || bad != 0 {
				t.Fatalf("mismatched %d, %v", bad, err)
			}
			if want := map[string]int{"drop": 0, "land": 0, "tear": 1}[mode]; undef != want {
				t.Errorf("undefined %d, want %d", undef, want)
			}
			w.Step() // an acknowledged write defines the block again
			if _, bad, undef, _ := w.VerifyAll(context.Background()); bad != 0 || undef != 0 {
				t.Errorf("after a good write: mismatched %d, undefined %d", bad, undef)
			}
			if s := w.Stats(); s.WriteErrors != 1 || len(s.Errors) != 1 || s.Errors[0].Op != OpWrite {
				t.Errorf("errors %+v", s.Errors)
			}
		})
	}
}

// An acknowledged write the medium lost, a block put back to an older
// generation and a block of another index are mismatches.
func TestWorker_LostAndMisplacedWritesAreMismatches(t *testing.T) {
	w, dev, _ := newWorker(t, 2)
	for range 20 {
		w.Step()
	}
	stale := make([]byte, block.Size)
	block.Fill(stale, block.VolumeID("v"), 0, w.model.Acked(0)-1, time.Unix(0, 0))
	copy(dev.blocks[0], stale)
	copy(dev.blocks[1], dev.blocks[0]) // block 0's content at block 1
	_, bad, _, err := w.VerifyAll(context.Background())
	if err != nil || bad != 2 {
		t.Fatalf("mismatched %d, %v; want 2", bad, err)
	}
	got := w.Stats().Findings
	if len(got) != 2 || got[0].Block != 0 || got[1].Block != 1 {
		t.Fatalf("findings %+v", got)
	}
}

func TestWorker_RecordsReadOnlyAndStalls(t *testing.T) {
	w, dev, clk := newWorker(t, 4)
	start := clk.Now()
	dev.slow = 3 * time.Second
	w.Step()
	dev.failNext = []string{"erofs"}
	w.Step()
	s := w.Stats()
	if len(s.Stalls) != 1 || s.Stalls[0].Took != 3*time.Second || !s.Stalls[0].At.Equal(start) {
		t.Errorf("stalls %+v", s.Stalls)
	}
	if !s.ReadOnly.Equal(start.Add(3 * time.Second)) {
		t.Errorf("read-only since %v", s.ReadOnly)
	}
	if s.MaxOp != 3*time.Second {
		t.Errorf("slowest %v", s.MaxOp)
	}
}

// Swapping the device keeps the model: a restaged volume's device holds
// what the old one held, and the verifier proves it.
func TestWorker_SwapKeepsTheModel(t *testing.T) {
	w, dev, clk := newWorker(t, 8)
	for range 50 {
		w.Step()
	}
	copyDev := newMemDev(8, clk)
	for i := range dev.blocks {
		copy(copyDev.blocks[i], dev.blocks[i])
	}
	old, err := w.Swap(context.Background(), nil)
	if err != nil || old != dev {
		t.Fatalf("pause: %v %v", old, err)
	}
	w.Step() // paused: nothing
	if _, err := w.Swap(context.Background(), copyDev); err != nil {
		t.Fatal(err)
	}
	if _, bad, _, err := w.VerifyAll(context.Background()); bad != 0 || err != nil {
		t.Errorf("after the swap: mismatched %d, %v", bad, err)
	}
	empty := newMemDev(8, clk)
	w.Swap(context.Background(), empty)
	if _, bad, _, _ := w.VerifyAll(context.Background()); bad == 0 {
		t.Error("a fresh device passed for the written one")
	}
	if _, err := w.Swap(context.Background(), newMemDev(9, clk)); err == nil {
		t.Error("a device of another size was accepted")
	}
}

// The file device on a real filesystem: data blocks written in place
// with fsync, meta blocks replaced by rename; both read back intact.
func TestFiles_WriteAndReadBackOnARealFilesystem(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFiles(dir, 2, 4, 3, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if fs.Blocks() != 11 {
		t.Fatalf("blocks %d", fs.Blocks())
	}
	w := New(Config{Volume: "fs", ReadEvery: 1, Seed: 3}, fs)
	for range 60 {
		w.Step()
	}
	if _, bad, undef, err := w.VerifyAll(context.Background()); bad != 0 || undef != 0 || err != nil {
		t.Fatalf("mismatched %d undefined %d %v", bad, undef, err)
	}
	if s := w.Stats(); s.WriteErrors != 0 || s.ReadErrors != 0 {
		t.Fatalf("errors %+v", s.Errors)
	}
	if _, err := os.Stat(filepath.Join(dir, "meta-0")); err != nil {
		t.Errorf("no meta file: %v", err)
	}
	// A truncated meta file is a loss, not a read error.
	var meta uint64
	for i := uint64(8); i < 11; i++ {
		if w.model.Acked(i) != 0 {
			meta = i
		}
	}
	if meta == 0 {
		t.Fatal("no meta block was written")
	}
	if err := os.Truncate(filepath.Join(dir, "meta-"+string(rune('0'+meta-8))), 100); err != nil {
		t.Fatal(err)
	}
	if _, bad, _, err := w.VerifyAll(context.Background()); bad != 1 || err != nil {
		t.Errorf("truncated meta file: mismatched %d, %v", bad, err)
	}
}

func TestRaw_WritesAreReadBack(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, make([]byte, 8*block.Size), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRaw(p, 8, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := New(Config{Volume: "raw", ReadEvery: 2, Seed: 9}, r)
	for range 40 {
		w.Step()
	}
	if _, bad, _, err := w.VerifyAll(context.Background()); bad != 0 || err != nil {
		t.Fatalf("mismatched %d, %v", bad, err)
	}
}

func TestWorker_SwapGivesUpOnAHungOperation(t *testing.T) {
	w, _, _ := newWorker(t, 1)
	w.opMu.Lock() // an operation that never returns
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := w.Swap(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Swap: %v, want the deadline", err)
	}
	w.opMu.Unlock()
}

func TestModel_Verdicts(t *testing.T) {
	vol := block.VolumeID("m")
	buf := make([]byte, block.Size)
	m := NewModel(vol, 1)
	if v, _ := m.Check(0, buf); v != Intact {
		t.Errorf("never written, zeroes: %v", v)
	}
	block.Fill(buf, vol, 0, 5, time.Unix(0, 0))
	m.Wrote(0, 5, nil)
	if v, _ := m.Check(0, buf); v != Intact {
		t.Errorf("acked 5, read 5: %v", v)
	}
	m.Wrote(0, 6, errors.New("EIO"))
	got := []Verdict{}
	for _, gen := range []uint64{5, 6} {
		block.Fill(buf, vol, 0, gen, time.Unix(0, 0))
		v, _ := m.Check(0, buf)
		got = append(got, v)
	}
	// 6 landed: it is the content now, so 5 is no longer acceptable.
	block.Fill(buf, vol, 0, 5, time.Unix(0, 0))
	v, _ := m.Check(0, buf)
	got = append(got, v)
	if d := cmp.Diff([]Verdict{Intact, Intact, Mismatch}, got); d != "" {
		t.Errorf("verdicts (-want +got):\n%s", d)
	}
}
