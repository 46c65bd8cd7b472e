package fshealth

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// The on-disk ext2/3/4 superblock, as much of it as tells whether the
// filesystem records errors: read before NodeStage checks and mounts an
// existing filesystem, when nothing has mounted it yet (the sysfs record
// exists only while it is mounted). Offsets are those of struct
// ext4_super_block (fs/ext4/ext4.h); the superblock starts 1024 bytes
// into the device.
const (
	superblockOffset = 1024
	superblockSize   = 1024

	sbMagic           = 0x38 // __le16 s_magic
	sbState           = 0x3A // __le16 s_state
	sbErrors          = 0x3C // __le16 s_errors
	sbFeatureIncompat = 0x60 // __le32 s_feature_incompat
	sbErrorCount      = 0x194
	sbFirstErrorTime  = 0x198
	sbFirstErrorFunc  = 0x1A8 // __u8[32]
	sbLastErrorTime   = 0x1CC
	sbLastErrorFunc   = 0x1E0 // __u8[32]

	extMagic        = 0xEF53
	stateErrorFS    = 0x0002 // EXT4_ERROR_FS
	incompatRecover = 0x0004 // EXT4_FEATURE_INCOMPAT_RECOVER: the journal needs replay
)

// ErrNotExt is returned for a device whose superblock is not ext2/3/4's.
var ErrNotExt = errors.New("no ext2/3/4 superblock")

// Superblock is what an unmounted ext2/3/4 filesystem's superblock says
// of its errors.
type Superblock struct {
	// ErrorState: s_state has EXT4_ERROR_FS — the filesystem was marked
	// as having errors and was not checked since.
	ErrorState bool
	// Errors is s_error_count; First and Last the recorded errors.
	Errors      uint32
	First, Last ErrorRecord
	// Behavior is s_errors, the default errors= behaviour.
	Behavior string
	// NeedsRecovery: the journal holds transactions a mount or e2fsck
	// replays.
	NeedsRecovery bool
}

// RecordsErrors reports whether the filesystem records errors: marked
// with errors, or counting some.
func (s Superblock) RecordsErrors() bool { return s.ErrorState || s.Errors > 0 }

// ReadSuperblock reads the ext2/3/4 superblock of the device r (one
// bounded read of 1024 bytes at offset 1024); ErrNotExt when the magic
// is not ext's.
func ReadSuperblock(r io.ReaderAt) (Superblock, error) {
	b := make([]byte, superblockSize)
	if _, err := r.ReadAt(b, superblockOffset); err != nil {
		return Superblock{}, fmt.Errorf("read the superblock: %w", err)
	}
	return ParseSuperblock(b)
}

// ParseSuperblock parses a 1024-byte ext2/3/4 superblock.
func ParseSuperblock(b []byte) (Superblock, error) {
	if len(b) < superblockSize {
		return Superblock{}, fmt.Errorf("superblock of %d bytes, want %d", len(b), superblockSize)
	}
	le := binary.LittleEndian
	if le.Uint16(b[sbMagic:]) != extMagic {
		return Superblock{}, ErrNotExt
	}
	s := Superblock{
		ErrorState:    le.Uint16(b[sbState:])&stateErrorFS != 0,
		Errors:        le.Uint32(b[sbErrorCount:]),
		NeedsRecovery: le.Uint32(b[sbFeatureIncompat:])&incompatRecover != 0,
		First:         ErrorRecord{Time: unixTime(le.Uint32(b[sbFirstErrorTime:])), Func: cString(b[sbFirstErrorFunc : sbFirstErrorFunc+32])},
		Last:          ErrorRecord{Time: unixTime(le.Uint32(b[sbLastErrorTime:])), Func: cString(b[sbLastErrorFunc : sbLastErrorFunc+32])},
	}
	switch le.Uint16(b[sbErrors:]) {
	case 1:
		s.Behavior = "continue"
	case 2:
		s.Behavior = "remount-ro"
	case 3:
		s.Behavior = "panic"
	}
	return s, nil
}

func unixTime(s uint32) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(int64(s), 0).UTC()
}

// cString is a NUL-padded name, kept to printable ASCII.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			out = append(out, c)
		}
	}
	return string(out)
}

// Summary says what the superblock records, for a log line: "7 errors
// since 2026-12-04T17:35:19Z (the last in __ext4_new_inode)".
func (s Superblock) Summary() string {
	h := Health{Errors: int64(s.Errors), First: s.First, Last: s.Last}
	if s.Errors == 0 {
		return "marked as having errors"
	}
	out := h.errorsSince()
	if s.Last.Func != "" {
		out += " (the last in " + s.Last.Func + ")"
	}
	return out
}
