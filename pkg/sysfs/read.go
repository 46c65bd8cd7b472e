package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
)

// AttrReader reads attributes and directories of an FS through reusable
// buffers, so that a pass over thousands of attributes allocates only
// the values that changed. Its ReadAttr and ReadOptionalAttr behave
// exactly like the FS methods of the same name; OpenDir gives a Dir to
// list a directory and read the attributes below it without walking the
// path again. An AttrReader is not safe for concurrent use: one pass at a
// time.
type AttrReader struct {
	fs  FS
	buf []byte
	// path is the NUL-terminated path of the current system call.
	path []byte
	// dents, names and refs are Dir.Names' scratch space.
	dents  []byte
	names  []byte
	refs   []nameRef
	counts Counts
}

// NewAttrReader returns an AttrReader over f. It reads nothing.
func NewAttrReader(f FS) *AttrReader {
	return &AttrReader{fs: f}
}

// FS is the tree the reader reads.
func (r *AttrReader) FS() FS { return r.fs }

// Counts returns the system calls made so far, by purpose.
func (r *AttrReader) Counts() Counts { return r.counts }

// ReadAttr is FS.ReadAttr through the reader's buffer.
func (r *AttrReader) ReadAttr(rel string) (string, error) {
	b, err := r.root().read(rel)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", rel, err)
	}
	return string(b), nil
}

// ReadOptionalAttr is FS.ReadOptionalAttr through the reader's buffer.
func (r *AttrReader) ReadOptionalAttr(rel string) (value string, ok bool, err error) {
	b, err := r.root().read(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", rel, err)
	}
	return string(b), true, nil
}

// root is the FS root as a Dir whose descriptor is the current directory
// marker: reads through it resolve rel from the root by path.
func (r *AttrReader) root() Dir {
	return Dir{r: r, rel: "", fd: atFDCWD}
}
