package workload

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/hack/lab/soak/block"
)

// Device is the medium a worker writes and reads, one block at a time.
// A write returns once the block is durable (what an application that
// fsyncs is promised); a read goes to the medium, never a cache.
type Device interface {
	// WriteBlock writes block.Size bytes at block i.
	WriteBlock(i uint64, buf []byte) error
	// ReadBlock reads block i into buf.
	ReadBlock(i uint64, buf []byte) error
	// Blocks is the number of blocks.
	Blocks() uint64
	// Close releases the device.
	Close() error
}

// Aligned returns a block.Size buffer aligned for O_DIRECT.
func Aligned() []byte {
	b := make([]byte, 2*block.Size)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (block.Size - 1))
	if off != 0 {
		off = block.Size - off
	}
	return b[off : off+block.Size : off+block.Size]
}

// Raw is a block device (or a file standing in for one) opened with
// O_DIRECT|O_DSYNC: every write is on the medium when it returns, every
// read comes from it.
type Raw struct {
	f      *os.File
	blocks uint64
}

var _ Device = (*Raw)(nil)

// OpenRaw opens path for direct I/O over its first blocks blocks.
// direct false leaves O_DIRECT out (for a test on a filesystem without
// it, such as tmpfs); O_DSYNC stays.
func OpenRaw(path string, blocks uint64, direct bool) (*Raw, error) {
	flags := os.O_RDWR | unix.O_DSYNC
	if direct {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, err
	}
	return &Raw{f: f, blocks: blocks}, nil
}

func (r *Raw) WriteBlock(i uint64, buf []byte) error {
	_, err := r.f.WriteAt(buf[:block.Size], int64(i)*block.Size)
	return err
}

func (r *Raw) ReadBlock(i uint64, buf []byte) error {
	_, err := r.f.ReadAt(buf[:block.Size], int64(i)*block.Size)
	return err
}

func (r *Raw) Blocks() uint64 { return r.blocks }
func (r *Raw) Close() error   { return r.f.Close() }

// Files is a set of files on a filesystem, written the way applications
// write durable data: data files overwritten in place (pwrite, then
// fsync), and small meta files replaced whole (write a temporary file,
// fsync, rename over the old one, fsync the directory). Reads use
// O_DIRECT so they come from the device, not the page cache.
type Files struct {
	dir        string
	data       []*os.File // the data files, for writes
	direct     []*os.File // the same files opened O_DIRECT, for reads
	perFile    uint64
	metas      uint64
	directRead bool
}

var _ Device = (*Files)(nil)

// OpenFiles creates (or opens) files data files of perFile blocks and
// metas meta files in dir. Blocks [0, files×perFile) are the data files'
// blocks in order; the metas blocks after them are the meta files.
func OpenFiles(dir string, files int, perFile, metas uint64, directRead bool) (*Files, error) {
	fs := &Files{dir: dir, perFile: perFile, metas: metas, directRead: directRead}
	for n := range files {
		p := filepath.Join(dir, fmt.Sprintf("data-%d", n))
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			fs.Close()
			return nil, err
		}
		fs.data = append(fs.data, f)
		if err := f.Truncate(int64(perFile) * block.Size); err != nil {
			fs.Close()
			return nil, err
		}
		flags := os.O_RDONLY
		if directRead {
			flags |= unix.O_DIRECT
		}
		d, err := os.OpenFile(p, flags, 0)
		if err != nil {
			fs.Close()
			return nil, err
		}
		fs.direct = append(fs.direct, d)
	}
	if err := syncDir(dir); err != nil {
		fs.Close()
		return nil, err
	}
	return fs, nil
}

func (fs *Files) dataBlocks() uint64 { return uint64(len(fs.data)) * fs.perFile }

// Blocks counts the data files' blocks and the meta files.
func (fs *Files) Blocks() uint64 { return fs.dataBlocks() + fs.metas }

func (fs *Files) metaPath(i uint64) string {
	return filepath.Join(fs.dir, fmt.Sprintf("meta-%d", i-fs.dataBlocks()))
}

func (fs *Files) WriteBlock(i uint64, buf []byte) error {
	if i >= fs.dataBlocks() {
		return fs.replaceMeta(i, buf)
	}
	f := fs.data[i/fs.perFile]
	if _, err := f.WriteAt(buf[:block.Size], int64(i%fs.perFile)*block.Size); err != nil {
		return err
	}
	return f.Sync()
}

// replaceMeta writes the meta file of block i whole: temporary file,
// fsync, rename, fsync of the directory.
func (fs *Files) replaceMeta(i uint64, buf []byte) error {
	final := fs.metaPath(i)
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(buf[:block.Size]); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return syncDir(fs.dir)
}

func (fs *Files) ReadBlock(i uint64, buf []byte) error {
	if i >= fs.dataBlocks() {
		return fs.readMeta(i, buf)
	}
	_, err := fs.direct[i/fs.perFile].ReadAt(buf[:block.Size], int64(i%fs.perFile)*block.Size)
	return err
}

// readMeta reads a meta file; one that does not exist yet reads as
// zeroes (never written).
func (fs *Files) readMeta(i uint64, buf []byte) error {
	flags := os.O_RDONLY
	if fs.directRead {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(fs.metaPath(i), flags, 0)
	if os.IsNotExist(err) {
		clear(buf[:block.Size])
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := f.ReadAt(buf[:block.Size], 0)
	if n == block.Size {
		return nil
	}
	if err != nil && err != io.EOF {
		return err
	}
	// A short file is judged, not failed: the rest reads as zeroes, which
	// the model calls a loss unless a write of it failed.
	clear(buf[n:block.Size])
	return nil
}

func (fs *Files) Close() error {
	var first error
	for _, f := range append(fs.data, fs.direct...) {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	fs.data, fs.direct = nil, nil
	return first
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
