package sysfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxAttrSize bounds one attribute read. sysfs attributes are at most one
// page; anything longer is not an attribute pathmend reads.
const maxAttrSize = 4096

// FS is a sysfs tree rooted at a directory: "/sys" on a node, a fixture
// tree in tests. Every path given to its methods is relative to the root
// ("class/nvme/nvme0/state"). FS is a value; it holds no open files and is
// safe for concurrent use.
type FS struct {
	root string
}

// New returns an FS rooted at root. The root is not read until a method is
// called, so construction never touches the host.
func New(root string) FS {
	return FS{root: filepath.Clean(root)}
}

// Root is the directory the FS reads from.
func (f FS) Root() string { return f.root }

// Path joins rel onto the root. rel is cleaned and may not escape the root.
func (f FS) Path(rel string) string {
	return filepath.Join(f.root, filepath.Clean("/"+rel))
}

// ReadAttr reads a required attribute and returns its value with the
// trailing newline and any trailing space padding removed. A missing or
// unreadable attribute is an error naming rel.
func (f FS) ReadAttr(rel string) (string, error) {
	b, err := f.readBounded(rel)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", rel, err)
	}
	return trimAttr(b), nil
}

// ReadOptionalAttr reads an attribute that a kernel may not publish. ok is
// false when the attribute does not exist; any other failure is an error.
func (f FS) ReadOptionalAttr(rel string) (value string, ok bool, err error) {
	b, err := f.readBounded(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", rel, err)
	}
	return trimAttr(b), true, nil
}

// ReadIntAttr reads a required attribute holding a decimal integer.
func (f FS) ReadIntAttr(rel string) (int64, error) {
	s, err := f.ReadAttr(rel)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", rel, err)
	}
	return v, nil
}

// ReadDir lists the entry names of a directory, sorted.
func (f FS) ReadDir(rel string) ([]string, error) {
	entries, err := os.ReadDir(f.Path(rel))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", rel, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// ReadLink returns the target of a symlink as stored (usually relative).
func (f FS) ReadLink(rel string) (string, error) {
	t, err := os.Readlink(f.Path(rel))
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", rel, err)
	}
	return t, nil
}

// Stat returns the FileInfo of rel, following symlinks.
func (f FS) Stat(rel string) (fs.FileInfo, error) {
	fi, err := os.Stat(f.Path(rel))
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", rel, err)
	}
	return fi, nil
}

// WriteAttr writes value to a write-only or read-write attribute in one
// write(2), as the kernel expects. The file is never created.
func (f FS) WriteAttr(rel, value string) error {
	fh, err := os.OpenFile(f.Path(rel), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	_, werr := fh.Write([]byte(value))
	cerr := fh.Close()
	if werr != nil {
		return fmt.Errorf("write %s: %w", rel, werr)
	}
	if cerr != nil {
		return fmt.Errorf("close %s: %w", rel, cerr)
	}
	return nil
}

func (f FS) readBounded(rel string) ([]byte, error) {
	fh, err := os.Open(f.Path(rel))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	buf := make([]byte, maxAttrSize+1)
	n, err := io.ReadFull(fh, buf)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		err = nil
	case err == nil:
		return nil, fmt.Errorf("attribute longer than %d bytes", maxAttrSize)
	}
	return buf[:n], err
}

// trimAttr drops the trailing newline and the space padding some attributes
// carry (an NVMe model is padded to 40 bytes), plus NUL terminators.
func trimAttr(b []byte) string {
	return string(bytes.TrimRight(b, "\n \x00"))
}

// ErrNotSysfs is wrapped by CheckRoot's error for a root that exists
// but is not a sysfs tree.
var ErrNotSysfs = errors.New("not a sysfs tree")

// rootDirs are directories every sysfs mount has, whatever modules are
// loaded: a node without the NVMe or iSCSI modules has no class/nvme or
// class/iscsi_session, but always class/ and devices/. An empty directory
// where /sys should be mounted (a container without the host's /sys) has
// neither.
var rootDirs = []string{"class", "devices"}

// CheckRoot reports whether the root is a sysfs tree: an existing
// directory with class/ and devices/ directories. The error names the
// root; for an existing root that lacks them it wraps ErrNotSysfs. An
// absent class/nvme or class/iscsi_session is not checked: it is a node
// whose modules are not loaded, a valid state with nothing on it.
func (f FS) CheckRoot() error {
	fi, err := os.Stat(f.root)
	if err != nil {
		return fmt.Errorf("sysfs root %s: %w", f.root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("sysfs root %s is not a directory: %w", f.root, ErrNotSysfs)
	}
	for _, d := range rootDirs {
		fi, err := os.Stat(f.Path(d))
		if err != nil || !fi.IsDir() {
			return fmt.Errorf("sysfs root %s has no %s/ directory (is sysfs mounted there?): %w", f.root, d, ErrNotSysfs)
		}
	}
	return nil
}

// IsNotExist reports whether err says a sysfs entry does not exist.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// Base returns the last element of a sysfs path or symlink target.
func Base(p string) string {
	return p[strings.LastIndexByte(p, '/')+1:]
}
