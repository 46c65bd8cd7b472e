package sysfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counts are the system calls an AttrReader made, by purpose: attribute
// files opened and read, directories opened and listed, stats.
type Counts struct {
	Reads, Lists, Stats int
}

// Dir is a directory of an FS held open for a pass of reads: its
// identity comes from the open descriptor, its entries and attributes are
// read relative to it, so everything read through one Dir belongs to the
// directory that was opened even if the kernel replaces it meanwhile. A
// Dir shares its AttrReader's buffers: use it from one goroutine and
// Close it before the pass ends.
type Dir struct {
	r   *AttrReader
	rel string
	fd  int
	id  Identity
	// listed is set once Names has read the directory to its end.
	listed bool
}

// OpenRoot opens the root of the FS for a pass: directories opened
// through it are found without walking the root's own path again. Close
// it when the pass ends; a root held across passes would keep reading a
// tree the root path no longer names. When the root cannot be opened the
// Dir resolves every path from the root path, and the error surfaces at
// the first directory opened through it.
func (r *AttrReader) OpenRoot() Dir {
	fd, err := r.openat(unix.AT_FDCWD, r.fs.Path(""), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return r.root()
	}
	return Dir{r: r, fd: fd}
}

// OpenDir opens the directory rel (following symlinks, as the class links
// of sysfs need) and stats it. A missing directory is an error that
// satisfies IsNotExist.
func (r *AttrReader) OpenDir(rel string) (Dir, error) {
	return r.root().OpenDir(rel)
}

// OpenDir opens the directory name below d (following symlinks) and
// stats it. Through a root Dir, name is the path from the FS root and
// costs no allocation. A missing directory is an error that satisfies
// IsNotExist.
func (d Dir) OpenDir(name string) (Dir, error) {
	rel := name
	if d.rel != "" {
		rel = d.rel + "/" + name
	}
	fd, err := d.r.openat(d.fd, d.target(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return Dir{}, fmt.Errorf("list %s: %w", rel, &fs.PathError{Op: "open", Path: d.full(name), Err: err})
	}
	var st unix.Statx_t
	if err := d.r.statx(fd, "", unix.AT_EMPTY_PATH, &st); err != nil {
		unix.Close(fd)
		return Dir{}, fmt.Errorf("stat %s: %w", rel, &fs.PathError{Op: "statx", Path: d.full(name), Err: err})
	}
	d.r.counts.Lists++
	return Dir{r: d.r, rel: rel, fd: fd, id: identityOf(&st)}, nil
}

// Close releases the directory.
func (d Dir) Close() {
	if d.r != nil && d.fd != atFDCWD {
		unix.Close(d.fd)
	}
}

// Rel is the path the directory was opened at.
func (d Dir) Rel() string { return d.rel }

// Identity is the identity of the opened directory.
func (d Dir) Identity() Identity { return d.id }

// ReadAttr reads the required attribute name (which may lie in a
// subdirectory, "nvme0c0n1/ana_state") with one bounded read and returns
// it trimmed like FS.ReadAttr. The bytes are the reader's buffer: valid
// until its next read. A missing attribute is an error naming its path
// (rel/name) that satisfies IsNotExist.
func (d Dir) ReadAttr(name string) ([]byte, error) {
	b, err := d.read(name)
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", d.rel, name, err)
	}
	return b, nil
}

// ReadOptionalAttr is ReadAttr for an attribute a kernel may not publish:
// ok is false when it does not exist.
func (d Dir) ReadOptionalAttr(name string) (value []byte, ok bool, err error) {
	b, err := d.read(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s/%s: %w", d.rel, name, err)
	}
	return b, true, nil
}

// Stat returns the identity of name below the directory, following
// symlinks. A missing entry is an error that satisfies IsNotExist.
func (d Dir) Stat(name string) (Identity, error) {
	var st unix.Statx_t
	d.r.counts.Stats++
	if err := d.r.statx(d.fd, d.target(name), 0, &st); err != nil {
		return Identity{}, fmt.Errorf("stat %s/%s: %w", d.rel, name, &fs.PathError{Op: "stat", Path: d.full(name), Err: err})
	}
	return identityOf(&st), nil
}

// read is one open, one read into the reader's buffer and one close. A
// sysfs attribute is produced whole by its show() function (at most a
// page) and one read of a larger buffer returns all of it; a regular
// file returns fewer bytes than asked only at its end. A full buffer
// means the value is longer than an attribute can be.
func (d Dir) read(name string) ([]byte, error) {
	r := d.r
	r.counts.Reads++
	fd, err := r.openat(d.fd, d.target(name), unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.full(name), Err: err}
	}
	if r.buf == nil {
		r.buf = make([]byte, maxAttrSize+1)
	}
	var n int
	err = ignoringEINTR(func() (err error) { n, err = unix.Read(fd, r.buf); return err })
	unix.Close(fd)
	switch {
	case err != nil:
		return nil, &fs.PathError{Op: "read", Path: d.full(name), Err: err}
	case n > maxAttrSize:
		return nil, fmt.Errorf("attribute longer than %d bytes", maxAttrSize)
	}
	return trimAttrBytes(r.buf[:n]), nil
}

// atFDCWD marks the root Dir of an AttrReader, whose names are paths
// relative to the FS root.
const atFDCWD = unix.AT_FDCWD

// target is what openat gets for name: the name itself below an open
// directory, the full path for the path-resolving root Dir. A name that
// is not a clean downward path goes through FS.Path, which keeps it
// below the root, as every FS method does.
func (d Dir) target(name string) string {
	if d.fd == atFDCWD || !downward(name) {
		return d.r.fs.Path(d.rel + "/" + name)
	}
	return name
}

// full is the path of name for error messages.
func (d Dir) full(name string) string {
	return d.r.fs.Path(d.rel + "/" + name)
}

// downward reports whether name is a relative path without "." or ".."
// elements or empty ones, which openat resolves below its directory.
func downward(name string) bool {
	if name == "" || name[0] == '/' {
		return false
	}
	for i := 0; i < len(name); {
		j := strings.IndexByte(name[i:], '/')
		if j < 0 {
			j = len(name) - i
		}
		if e := name[i : i+j]; e == "" || e == "." || e == ".." {
			return false
		}
		i += j + 1
	}
	return true
}

// statxMask asks statx for what an Identity holds (the device is always
// returned).
const statxMask = unix.STATX_INO | unix.STATX_MTIME

// openat and statx are the system calls with the path in the reader's
// NUL-terminated scratch buffer: the string conversions of package unix
// allocate on every call, and a pass makes tens of thousands of them.
func (r *AttrReader) openat(dirfd int, name string, flags int) (int, error) {
	p := r.cpath(name)
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&p[0])), uintptr(flags), 0, 0, 0)
		switch errno {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, errno
	}
}

func (r *AttrReader) statx(dirfd int, name string, flags int, st *unix.Statx_t) error {
	p := r.cpath(name)
	for {
		_, _, errno := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(&p[0])), uintptr(flags), statxMask, uintptr(unsafe.Pointer(st)), 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return errno
	}
}

// cpath copies name into the reader's path buffer with a terminating NUL.
func (r *AttrReader) cpath(name string) []byte {
	r.path = append(append(r.path[:0], name...), 0)
	return r.path
}

// ignoringEINTR retries a system call interrupted by a signal, as package
// os does.
func ignoringEINTR(call func() error) error {
	for {
		if err := call(); err != unix.EINTR {
			return err
		}
	}
}

// Intern returns prev when b holds the same text, and b as a new string
// otherwise: an attribute that did not change costs no allocation.
func Intern(b []byte, prev string) string {
	if string(b) == prev {
		return prev
	}
	return string(b)
}

// trimAttrBytes is trimAttr without the copy.
func trimAttrBytes(b []byte) []byte {
	return bytes.TrimRight(b, "\n \x00")
}
