// Package block is the soak's self-describing block: 4 KiB whose header
// names the volume, the block's index and the generation of the write
// that made it, followed by a payload derived from those three and a
// CRC-32C over everything before it. A block read back therefore says by
// itself whether it is whole (the checksum), where it belongs (volume and
// index: a block written elsewhere, or by another volume, is misplaced)
// and which write it is (the generation), so the soak's verifier needs
// to remember only the generation it expects per block.
package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// Size is the size of a block, and the alignment O_DIRECT needs on the
// lab's devices (512-byte logical sectors, 4 KiB pages).
const Size = 4096

// magic marks a soak block: "pmSK".
const magic = 0x706d534b

// Layout: magic u32 | volume u32 | index u64 | generation u64 | written
// (unix ns) i64 | payload … | crc32c u32 (the last 4 bytes).
const (
	offMagic = 0
	offVol   = 4
	offIndex = 8
	offGen   = 16
	offAt    = 24
	offData  = 32
	offCRC   = Size - 4
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Header is what a block says about itself.
type Header struct {
	Volume     uint32
	Index      uint64
	Generation uint64
	Written    time.Time
}

// Errors of Check. A block of zeroes was never written; a torn or
// corrupted block fails its checksum; a whole block of another index or
// volume is misplaced.
var (
	ErrZero      = errors.New("block was never written (all zero)")
	ErrChecksum  = errors.New("block checksum mismatch (torn or corrupted)")
	ErrMisplaced = errors.New("block belongs elsewhere")
)

// VolumeID folds a volume name into the header's 32-bit volume field.
func VolumeID(name string) uint32 {
	return crc32.Checksum([]byte(name), table)
}

// Fill writes into buf (at least Size bytes) the block of volume vol at
// index with generation gen, stamped at.
func Fill(buf []byte, vol uint32, index, gen uint64, at time.Time) {
	b := buf[:Size]
	binary.LittleEndian.PutUint32(b[offMagic:], magic)
	binary.LittleEndian.PutUint32(b[offVol:], vol)
	binary.LittleEndian.PutUint64(b[offIndex:], index)
	binary.LittleEndian.PutUint64(b[offGen:], gen)
	binary.LittleEndian.PutUint64(b[offAt:], uint64(at.UnixNano()))
	// xorshift64 seeded by the header: a different write never has the
	// same payload, so a stale block cannot pass for a fresh one.
	x := uint64(vol)<<32 ^ index*0x9e3779b97f4a7c15 ^ gen*0xbf58476d1ce4e5b9 | 1
	for i := offData; i < offCRC; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	binary.LittleEndian.PutUint32(b[offCRC:], crc32.Checksum(b[:offCRC], table))
}

// Check reads the block in buf (at least Size bytes), expected to be
// volume vol's block at index, and returns its header. The error is
// ErrZero, ErrChecksum or ErrMisplaced (wrapped with what was found).
func Check(buf []byte, vol uint32, index uint64) (Header, error) {
	b := buf[:Size]
	if binary.LittleEndian.Uint32(b[offCRC:]) != crc32.Checksum(b[:offCRC], table) {
		if allZero(b) {
			return Header{}, ErrZero
		}
		return Header{}, ErrChecksum
	}
	if binary.LittleEndian.Uint32(b[offMagic:]) != magic {
		return Header{}, fmt.Errorf("%w: no soak magic", ErrChecksum)
	}
	h := Header{
		Volume:     binary.LittleEndian.Uint32(b[offVol:]),
		Index:      binary.LittleEndian.Uint64(b[offIndex:]),
		Generation: binary.LittleEndian.Uint64(b[offGen:]),
		Written:    time.Unix(0, int64(binary.LittleEndian.Uint64(b[offAt:]))),
	}
	if h.Volume != vol || h.Index != index {
		return h, fmt.Errorf("%w: found volume %08x block %d generation %d, want volume %08x block %d", ErrMisplaced, h.Volume, h.Index, h.Generation, vol, index)
	}
	return h, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
