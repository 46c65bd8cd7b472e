package ueventtest

import (
	"fmt"
	"os"
	"sync"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// Conn is a fake uevent.Conn: what a test queues with Send, SendEvent,
// Overflow and Fail, Recv returns in order, blocking (on a channel, so a
// testing/synctest bubble sees it durably blocked) while nothing is
// queued. It is safe for concurrent use.
type Conn struct {
	mu     sync.Mutex
	items  []item
	ready  chan struct{}
	closed chan struct{}
	once   sync.Once
}

type item struct {
	msg    []byte
	kernel bool
	err    error
}

var _ uevent.Conn = (*Conn)(nil)

// NewConn returns an open fake socket with nothing queued.
func NewConn() *Conn {
	return &Conn{ready: make(chan struct{}, 1), closed: make(chan struct{})}
}

// Send queues one message; kernel says whether the kernel sent it.
func (c *Conn) Send(msg []byte, kernel bool) { c.put(item{msg: msg, kernel: kernel}) }

// SendEvent queues e as the kernel would send it.
func (c *Conn) SendEvent(e uevent.Event) { c.Send(uevent.Encode(e), true) }

// Overflow queues an overflow: Recv returns an error wrapping
// uevent.ErrOverflow, as the kernel's socket does after dropping
// messages.
func (c *Conn) Overflow() {
	c.put(item{err: fmt.Errorf("%w: fake", uevent.ErrOverflow)})
}

// Fail queues err for Recv to return.
func (c *Conn) Fail(err error) { c.put(item{err: err}) }

func (c *Conn) put(it item) {
	c.mu.Lock()
	c.items = append(c.items, it)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// Pending is the number of queued items Recv has not returned yet.
func (c *Conn) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}

// Recv returns the next queued item, or os.ErrClosed once closed.
func (c *Conn) Recv(b []byte) (int, bool, error) {
	for {
		select {
		case <-c.closed:
			return 0, false, os.ErrClosed
		default:
		}
		c.mu.Lock()
		if len(c.items) > 0 {
			it := c.items[0]
			c.items = c.items[1:]
			more := len(c.items) > 0
			c.mu.Unlock()
			if more {
				select {
				case c.ready <- struct{}{}:
				default:
				}
			}
			if it.err != nil {
				return 0, false, it.err
			}
			return copy(b, it.msg) + max(0, len(it.msg)-len(b)), it.kernel, nil
		}
		c.mu.Unlock()
		select {
		case <-c.ready:
		case <-c.closed:
		}
	}
}

// Close ends a Recv in progress and every later one.
func (c *Conn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}
