package workload

import (
	"errors"
	"fmt"

	"github.com/pathmend/pathmend/hack/lab/soak/block"
)

// Verdict is what a read block means given the writes that came before.
type Verdict int

const (
	// Intact: the block holds the last acknowledged write (or, after a
	// write that failed, one of the writes that failed since: a failed
	// write may or may not have reached the medium).
	Intact Verdict = iota
	// Undefined: the block is torn or unreadable as a soak block, and a
	// write to it failed since its last acknowledged write. A failed
	// write leaves its range undefined; not a loss.
	Undefined
	// Mismatch: anything else — an acknowledged write lost or replaced
	// by an older one, a block of another index or volume, a torn block
	// no failed write explains. Data was lost or corrupted.
	Mismatch
)

func (v Verdict) String() string {
	switch v {
	case Intact:
		return "intact"
	case Undefined:
		return "undefined after a failed write"
	case Mismatch:
		return "MISMATCH"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// slot is what the model knows of one block: the generation of its last
// acknowledged write (0: none) and the generations of the writes that
// failed since.
type slot struct {
	acked  uint64
	failed []uint64
}

// Model is the expected content of every block of one volume. It is not
// safe for concurrent use: one worker owns it.
type Model struct {
	vol   uint32
	slots []slot
}

// NewModel is the model of a volume of n blocks nobody wrote yet.
func NewModel(vol uint32, n uint64) *Model {
	return &Model{vol: vol, slots: make([]slot, n)}
}

// Blocks is the number of blocks modelled.
func (m *Model) Blocks() uint64 { return uint64(len(m.slots)) }

// Wrote records the outcome of writing generation gen to block i: an
// acknowledged write (err nil) defines the block; a failed one adds a
// possible content.
func (m *Model) Wrote(i, gen uint64, err error) {
	s := &m.slots[i]
	if err == nil {
		s.acked, s.failed = gen, s.failed[:0]
		return
	}
	if len(s.failed) < 64 {
		s.failed = append(s.failed, gen)
	}
}

// Acked returns the generation of block i's last acknowledged write.
func (m *Model) Acked(i uint64) uint64 { return m.slots[i].acked }

// Check judges buf, read from block i, and returns the verdict with a
// description of what was found when it is not Intact. Reading a
// generation a failed write left makes it the block's known content.
func (m *Model) Check(i uint64, buf []byte) (Verdict, string) {
	s := &m.slots[i]
	h, err := block.Check(buf, m.vol, i)
	switch {
	case errors.Is(err, block.ErrZero):
		if s.acked == 0 {
			return Intact, ""
		}
		if len(s.failed) > 0 {
			return Undefined, fmt.Sprintf("zeroes, generation %d acknowledged and %d failed writes since", s.acked, len(s.failed))
		}
		return Mismatch, fmt.Sprintf("zeroes where generation %d was acknowledged", s.acked)
	case errors.Is(err, block.ErrChecksum):
		if len(s.failed) > 0 {
			return Undefined, fmt.Sprintf("torn, generation %d acknowledged and %d failed writes since", s.acked, len(s.failed))
		}
		return Mismatch, fmt.Sprintf("torn or corrupted where generation %d was acknowledged: %v", s.acked, err)
	case err != nil:
		return Mismatch, err.Error()
	}
	if h.Generation == s.acked {
		return Intact, ""
	}
	for _, g := range s.failed {
		if g == h.Generation {
			// The failed write reached the medium: it is the content now.
			s.acked, s.failed = g, s.failed[:0]
			return Intact, ""
		}
	}
	if h.Generation < s.acked {
		return Mismatch, fmt.Sprintf("generation %d where %d was acknowledged: an acknowledged write was lost", h.Generation, s.acked)
	}
	return Mismatch, fmt.Sprintf("generation %d where %d was acknowledged and no write of it failed", h.Generation, s.acked)
}
