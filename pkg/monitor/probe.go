package monitor

import (
	"context"
	"net"
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
