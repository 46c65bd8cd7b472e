package block

import (
	"errors"
	"testing"
	"time"
)

func TestFillCheck_RoundTrips(t *testing.T) {
	buf := make([]byte, Size)
	at := time.Unix(1700000000, 123)
	vol := VolumeID("vol-a1")
	Fill(buf, vol, 42, 7, at)
	h, err := Check(buf, vol, 42)
	if err != nil {
		t.Fatal(err)
	}
	if h.Generation != 7 || h.Index != 42 || h.Volume != vol || !h.Written.Equal(at) {
		t.Errorf("header %+v", h)
	}
}

func TestCheck_TellsZeroTornAndMisplacedBlocks(t *testing.T) {
	vol := VolumeID("vol-a1")
	zero := make([]byte, Size)
	if _, err := Check(zero, vol, 1); !errors.Is(err, ErrZero) {
		t.Errorf("zero block: %v, want ErrZero", err)
	}

	torn := make([]byte, Size)
	Fill(torn, vol, 1, 2, time.Now())
	other := make([]byte, Size)
	Fill(other, vol, 1, 3, time.Now())
	copy(torn[2048:], other[2048:]) // half of one write, half of the next
	if _, err := Check(torn, vol, 1); !errors.Is(err, ErrChecksum) {
		t.Errorf("torn block: %v, want ErrChecksum", err)
	}

	flipped := make([]byte, Size)
	Fill(flipped, vol, 1, 2, time.Now())
	flipped[100] ^= 1
	if _, err := Check(flipped, vol, 1); !errors.Is(err, ErrChecksum) {
		t.Errorf("one flipped bit: %v, want ErrChecksum", err)
	}

	elsewhere := make([]byte, Size)
	Fill(elsewhere, vol, 9, 2, time.Now())
	if h, err := Check(elsewhere, vol, 1); !errors.Is(err, ErrMisplaced) || h.Index != 9 {
		t.Errorf("block of index 9 read at 1: %+v %v, want ErrMisplaced naming 9", h, err)
	}
	Fill(elsewhere, VolumeID("vol-b"), 1, 2, time.Now())
	if _, err := Check(elsewhere, vol, 1); !errors.Is(err, ErrMisplaced) {
		t.Errorf("another volume's block: %v, want ErrMisplaced", err)
	}
}

// Two writes of one block differ everywhere the payload is, so a stale
// block can never pass for a newer one with a patched header.
func TestFill_GenerationsDifferInThePayload(t *testing.T) {
	a, b := make([]byte, Size), make([]byte, Size)
	vol := VolumeID("v")
	Fill(a, vol, 5, 1, time.Unix(0, 0))
	Fill(b, vol, 5, 2, time.Unix(0, 0))
	same := 0
	for i := offData; i < offCRC; i++ {
		if a[i] == b[i] {
			same++
		}
	}
	if same > (offCRC-offData)/64 {
		t.Errorf("%d payload bytes equal between generations 1 and 2", same)
	}
}

func FuzzCheck(f *testing.F) {
	good := make([]byte, Size)
	Fill(good, 1, 2, 3, time.Unix(0, 0))
	f.Add(good, 10, byte(1))
	f.Fuzz(func(t *testing.T, b []byte, at int, flip byte) {
		buf := make([]byte, Size)
		copy(buf, b)
		if at >= 0 && at < Size {
			buf[at] ^= flip
		}
		if h, err := Check(buf, 1, 2); err == nil && (h.Volume != 1 || h.Index != 2) {
			t.Errorf("Check accepted %+v for volume 1 block 2", h)
		}
	})
}
