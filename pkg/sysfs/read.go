package sysfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// AttrReader reads attributes of an FS through one reusable buffer, so
// that a pass over thousands of attributes allocates only their values.
// Its methods behave exactly like the FS methods of the same name. An
// AttrReader is not safe for concurrent use; make one per pass.
type AttrReader struct {
	fs  FS
	buf []byte
}

// NewAttrReader returns an AttrReader over f. It reads nothing.
func NewAttrReader(f FS) *AttrReader {
	return &AttrReader{fs: f}
}

// ReadAttr is FS.ReadAttr through the reader's buffer.
func (r *AttrReader) ReadAttr(rel string) (string, error) {
	b, err := r.read(rel)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", rel, err)
	}
	return trimAttr(b), nil
}

// ReadOptionalAttr is FS.ReadOptionalAttr through the reader's buffer.
func (r *AttrReader) ReadOptionalAttr(rel string) (value string, ok bool, err error) {
	b, err := r.read(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", rel, err)
	}
	return trimAttr(b), true, nil
}

// read is FS.readBounded into r.buf: one open, reads until EOF or one
// byte past the bound, one close.
func (r *AttrReader) read(rel string) ([]byte, error) {
	fh, err := os.Open(r.fs.Path(rel))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	if r.buf == nil {
		r.buf = make([]byte, maxAttrSize+1)
	}
	n, err := io.ReadFull(fh, r.buf)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		err = nil
	case err == nil:
		return nil, fmt.Errorf("attribute longer than %d bytes", maxAttrSize)
	}
	return r.buf[:n], err
}
