package iscsi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// DefaultProbeTimeout bounds each of the two probes of a portal.
const DefaultProbeTimeout = 2 * time.Second

// Prober tells whether a portal is reachable now.
type Prober interface {
	// Probe checks portal once and returns what each probe found. It
	// returns within the prober's timeouts or when ctx ends.
	Probe(ctx context.Context, portal volume.Endpoint) Reachability
}

// ICMPResult is the outcome of an ICMP echo to a portal's host.
type ICMPResult string

// ICMP outcomes. "not permitted" is the honest answer on a node where
// pathmend lacks CAP_NET_RAW: it says nothing about the portal.
const (
	ICMPReply        ICMPResult = "reply"
	ICMPNoReply      ICMPResult = "no reply"
	ICMPNotPermitted ICMPResult = "not permitted"
	ICMPSkipped      ICMPResult = "skipped"
)

// Reachability is one probe of a portal. Only the TCP connect decides:
// an iSCSI login needs the TCP port, and ICMP is often filtered where TCP
// is not. The ICMP result is recorded in the verdict for the operator.
type Reachability struct {
	// TCP is nil when a TCP connection to the portal was established
	// (and closed at once), the connect error otherwise.
	TCP error
	// TCPTime is how long the connect took or failed after.
	TCPTime time.Duration
	// ICMP is the echo outcome, or "error: …" for a failure to send.
	ICMP ICMPResult
}

// Reachable reports whether the portal accepted a TCP connection.
func (r Reachability) Reachable() bool { return r.TCP == nil }

// TCPString renders the TCP result for a log line: "connected in 1.2ms"
// or the error.
func (r Reachability) TCPString() string {
	if r.TCP == nil {
		return "connected in " + r.TCPTime.Round(100*time.Microsecond).String()
	}
	return r.TCP.Error()
}

// NetProber probes with a TCP connect and, where permitted, an ICMP echo.
// The TCP connection is closed as soon as it is established, before any
// iSCSI PDU: targets log at most a connection closed before login.
type NetProber struct {
	// Timeout bounds each probe; DefaultProbeTimeout when zero.
	Timeout time.Duration
	// NoICMP skips the echo (ICMP is then "skipped").
	NoICMP bool
	// dial and ping are replaced in tests.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	ping func(ctx context.Context, ip net.IP, timeout time.Duration) ICMPResult
}

// Probe implements Prober. The portal host must be an IP address (the
// heal knows portals from sysfs, where they are addresses).
func (p *NetProber) Probe(ctx context.Context, portal volume.Endpoint) Reachability {
	timeout := p.Timeout
	if timeout == 0 {
		timeout = DefaultProbeTimeout
	}
	var r Reachability
	ip := net.ParseIP(portal.Host)
	if ip == nil {
		r.TCP = fmt.Errorf("portal host %q is not an IP address", portal.Host)
		r.ICMP = ICMPSkipped
		return r
	}
	dial := p.dial
	if dial == nil {
		d := &net.Dialer{}
		dial = d.DialContext
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	c, err := dial(tctx, "tcp", portal.String())
	r.TCPTime = time.Since(start)
	cancel()
	if err != nil {
		r.TCP = simplifyDialError(err)
	} else {
		_ = c.Close()
	}
	switch {
	case p.NoICMP:
		r.ICMP = ICMPSkipped
	case p.ping != nil:
		r.ICMP = p.ping(ctx, ip, timeout)
	default:
		r.ICMP = icmpEcho(ctx, ip, timeout)
	}
	return r
}

// simplifyDialError drops the *net.OpError wrapping ("dial tcp
// 127.0.0.2:3260: connect: connection refused" → the errno text), keeping
// the errno in the chain.
func simplifyDialError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("connect timed out: %w", err)
		}
		return op.Err // "connect: connection refused", errno kept
	}
	return err
}
