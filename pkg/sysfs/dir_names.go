package sysfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"golang.org/x/sys/unix"
)

// Names lists the entries of the directory, sorted, like FS.ReadDir (an
// empty directory lists as an empty, non-nil slice). d must come from
// OpenDir. prev
// is the caller's previous listing of the same directory (sorted, or
// nil): when nothing changed, Names returns prev itself, and a new
// listing reuses prev's strings for the names it still holds, so that an
// unchanged directory costs no allocation.
func (d *Dir) Names(prev []string) ([]string, error) {
	r := d.r
	r.names = r.names[:0]
	r.refs = r.refs[:0]
	if r.dents == nil {
		r.dents = make([]byte, 8192)
	}
	// A second listing starts again from the start.
	if d.listed {
		if _, err := unix.Seek(d.fd, 0, 0); err != nil {
			return nil, fmt.Errorf("list %s: %w", d.rel, &fs.PathError{Op: "seek", Path: d.full(""), Err: err})
		}
	}
	d.listed = true
	for {
		var n int
		err := ignoringEINTR(func() (err error) { n, err = unix.Getdents(d.fd, r.dents); return err })
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", d.rel, &fs.PathError{Op: "getdents", Path: r.fs.Path(d.rel), Err: err})
		}
		if n <= 0 {
			break
		}
		if err := r.collect(r.dents[:n]); err != nil {
			return nil, fmt.Errorf("list %s: %w", d.rel, err)
		}
	}
	slices.SortFunc(r.refs, func(a, b nameRef) int { return bytes.Compare(r.name(a), r.name(b)) })
	if len(prev) == len(r.refs) {
		same := true
		for i, ref := range r.refs {
			if string(r.name(ref)) != prev[i] {
				same = false
				break
			}
		}
		if same && prev != nil {
			return prev, nil
		}
	}
	out := make([]string, len(r.refs))
	for i, ref := range r.refs {
		out[i] = internSorted(prev, r.name(ref))
	}
	return out, nil
}

// nameRef locates one entry name in AttrReader.names.
type nameRef struct{ off, len int }

func (r *AttrReader) name(ref nameRef) []byte { return r.names[ref.off : ref.off+ref.len] }

// collect appends the names of a getdents64 buffer (struct
// linux_dirent64: d_ino, d_off, d_reclen, d_type, d_name NUL-terminated)
// to r.names, skipping "." and "..".
func (r *AttrReader) collect(buf []byte) error {
	const nameOff = 19 // 8 + 8 + 2 + 1
	for len(buf) > 0 {
		if len(buf) < nameOff {
			return errors.New("short directory entry")
		}
		reclen := int(buf[16]) | int(buf[17])<<8
		if reclen < nameOff || reclen > len(buf) {
			return fmt.Errorf("bad directory entry length %d", reclen)
		}
		name := buf[nameOff:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		buf = buf[reclen:]
		if string(name) == "." || string(name) == ".." {
			continue
		}
		r.refs = append(r.refs, nameRef{off: len(r.names), len: len(name)})
		r.names = append(r.names, name...)
	}
	return nil
}

// internSorted returns the string of sorted that equals b, or a new one.
func internSorted(sorted []string, b []byte) string {
	lo, hi := 0, len(sorted)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if sorted[m] < string(b) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(sorted) && sorted[lo] == string(b) {
		return sorted[lo]
	}
	return string(b)
}
