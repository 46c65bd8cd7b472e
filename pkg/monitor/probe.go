package monitor

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"
)

// Prober tells whether a TCP endpoint accepts connections. The monitor
// probes before every connect: a kernel connect to a dead target blocks
// for tens of seconds, a probe fails in its short timeout.
type Prober interface {
	Reachable(ctx context.Context, hostport string) error
}

// TCPProber dials the endpoint and closes the connection at once.
type TCPProber struct {
	// Timeout bounds one probe.
	Timeout time.Duration
}

// Reachable returns nil when a TCP connection to hostport succeeds within
// the timeout.
func (p TCPProber) Reachable(ctx context.Context, hostport string) error {
	d := net.Dialer{Timeout: p.Timeout}
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return err
	}
	return c.Close()
}

// errNoAnswer marks a probe that failed other than by a refusal: the
// endpoint did not answer within the probe's time (dropped packets, a host
// that is down), or the network has no route to it.
var errNoAnswer = errors.New("unreachable")

// refused reports whether err is the endpoint answering and refusing the
// connection (ECONNREFUSED), from the probe or from the kernel's connect:
// a retry costs one round trip, so it is never backed off.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
