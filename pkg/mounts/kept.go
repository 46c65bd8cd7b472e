package mounts

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Kept is the mount table of one mountinfo file as last read, read again
// only when the kernel says a mount of its namespace changed. An open
// /proc/<pid>/mountinfo reports POLLPRI (and POLLERR) to poll(2) once
// after every mount, unmount, move or remount in its mount namespace,
// mounts propagated into it included (proc(5), "/proc/pid/mounts"): so
// a call finds the table unchanged with one poll of the open file, and a
// node of thousands of mounts is not parsed again for every RPC that
// needs one path's layers.
//
// The poll is taken before the read: a change after the poll is in the
// text read, or signalled to the next call; none is missed. A file not
// on procfs (a copy of a table) is read at every call.
type Kept struct {
	path string

	mu sync.Mutex
	// fd is the open file, or -1. It is a raw descriptor on purpose: an
	// *os.File of a pollable file joins Go's netpoller, whose epoll_wait
	// would take the change signal before this poll sees it.
	fd    int
	polls bool   // fd is on procfs: its poll signals changes
	tb    *Table // the last table read; nil before the first read
	reads int    // how many times the file was read and parsed
}

// NewKept returns the kept table of the mountinfo file at path
// (SelfMountInfo for this process's). Nothing is read before the first
// call of Table.
func NewKept(path string) *Kept { return &Kept{path: path, fd: -1} }

// Table returns the mount table: the one read last, when the kernel has
// signalled no change of it since, else the file read again. The Table
// returned is never changed; a changed table is a new *Table.
func (k *Kept) Table() (*Table, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd < 0 {
		fd, err := unix.Open(k.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: k.path, Err: err}
		}
		var st unix.Statfs_t
		k.polls = unix.Fstatfs(fd, &st) == nil && st.Type == unix.PROC_SUPER_MAGIC
		k.fd = fd
	}
	if k.tb != nil && k.polls {
		changed, err := k.changed()
		if err == nil && !changed {
			return k.tb, nil
		}
	}
	tb, err := k.read()
	if err != nil {
		// The file is opened again at the next call: a descriptor that
		// failed once is not trusted to say what changed.
		unix.Close(k.fd)
		k.fd, k.tb = -1, nil
		return nil, err
	}
	k.tb = tb
	return tb, nil
}

// Reads returns how many times the file was read and parsed.
func (k *Kept) Reads() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reads
}

// Close releases the open file.
func (k *Kept) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd < 0 {
		return nil
	}
	err := unix.Close(k.fd)
	k.fd, k.tb = -1, nil
	return err
}

// changed polls the open file without waiting: POLLPRI or POLLERR say the
// namespace's mounts changed since the file was opened or last polled.
func (k *Kept) changed() (bool, error) {
	fds := []unix.PollFd{{Fd: int32(k.fd), Events: unix.POLLPRI}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return true, err
		}
		return n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0, nil
	}
}

// read reads the whole file again from its start, in one bounded read.
func (k *Kept) read() (*Table, error) {
	if _, err := unix.Seek(k.fd, 0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read %s: %w", k.path, err)
	}
	infos, err := readInfo(fdReader(k.fd), k.path)
	if err != nil {
		return nil, err
	}
	k.reads++
	return NewTable(infos), nil
}

// fdReader reads a raw descriptor (see Kept.fd).
type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
