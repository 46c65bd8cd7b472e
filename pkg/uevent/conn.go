package uevent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// KernelGroup is the netlink multicast group the kernel sends uevents to
// (udev re-broadcasts them, processed, on group 2; pathmend never
// listens there and needs no udev).
const KernelGroup = 1

// DefaultReceiveBuffer is the socket receive buffer Dial asks for: room
// for a few hundred uevents (each takes about 2–4 KiB of buffer), enough
// for the burst of a node connecting dozens of volumes at once while the
// reader is descheduled. What does not fit is lost and reported
// (ErrOverflow).
const DefaultReceiveBuffer = 1 << 20

// ErrOverflow is returned by Conn.Recv (wrapped) when the kernel dropped
// uevents because the socket's receive buffer was full: what they said is
// lost, and a listener must read the state they would have named again.
var ErrOverflow = errors.New("uevent: socket receive buffer overflowed; events were lost")

// Conn is a socket subscribed to the kernel's uevents. The netlink socket
// Dial opens is one; a test injects another.
type Conn interface {
	// Recv blocks until the next message, copies it into b and returns
	// its full length (larger than len(b) when it was truncated) and
	// whether the kernel sent it (netlink port 0: no process can).
	// It returns an error wrapping ErrOverflow when messages were lost,
	// and one wrapping os.ErrClosed once Close was called.
	Recv(b []byte) (n int, kernel bool, err error)
	// Close closes the socket and ends a Recv in progress.
	Close() error
}

// netlinkConn is a NETLINK_KOBJECT_UEVENT socket in the calling
// process's network namespace, read through the runtime's poller: a Recv
// in progress holds no thread, and Close ends it.
type netlinkConn struct {
	f *os.File
}

// Dial opens a NETLINK_KOBJECT_UEVENT socket bound to KernelGroup, with a
// receive buffer of rcvbuf bytes (DefaultReceiveBuffer when 0; the kernel
// doubles it for its bookkeeping). It uses SO_RCVBUFFORCE, which a
// process with CAP_NET_ADMIN may use beyond net.core.rmem_max, and falls
// back to SO_RCVBUF (capped by rmem_max) without it.
//
// The kernel sends uevents of objects outside a network namespace to
// every network namespace owned by the initial user namespace (Linux
// 4.18 and later): a pod with its own network namespace receives them; a
// pod in a user namespace does not.
func Dial(rcvbuf int) (Conn, error) {
	if rcvbuf <= 0 {
		rcvbuf = DefaultReceiveBuffer
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent: open netlink socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("uevent: set receive buffer: %w", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: KernelGroup}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uevent: bind netlink socket to the kernel group: %w", err)
	}
	// A non-blocking descriptor makes os.NewFile register it with the
	// runtime's poller.
	return &netlinkConn{f: os.NewFile(uintptr(fd), "uevent-netlink")}, nil
}

func (c *netlinkConn) Recv(b []byte) (int, bool, error) {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var (
		n    int
		from unix.Sockaddr
		rerr error
	)
	err = rc.Read(func(fd uintptr) bool {
		// MSG_TRUNC: the full length of a message longer than b.
		n, from, rerr = unix.Recvfrom(int(fd), b, unix.MSG_TRUNC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, false, err
	}
	if rerr == unix.ENOBUFS {
		return 0, false, fmt.Errorf("%w: %w", ErrOverflow, rerr)
	}
	if rerr != nil {
		return 0, false, fmt.Errorf("uevent: receive: %w", rerr)
	}
	sa, ok := from.(*unix.SockaddrNetlink)
	return n, ok && sa.Pid == 0, nil
}

func (c *netlinkConn) Close() error { return c.f.Close() }
