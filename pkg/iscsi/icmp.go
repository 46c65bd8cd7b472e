package iscsi

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// ICMP message types of an echo.
const (
	icmpv4EchoRequest = 8
	icmpv4EchoReply   = 0
	icmpv6EchoRequest = 128
	icmpv6EchoReply   = 129
)

// echoPayload marks pathmend's echo requests in a packet capture.
var echoPayload = []byte("pathmend portal probe")

// icmpEcho sends one ICMP echo request to ip over a raw socket and waits
// for the matching reply until timeout or ctx ends. Raw sockets need
// CAP_NET_RAW: without it the answer is ICMPNotPermitted, which says
// nothing about the portal.
func icmpEcho(ctx context.Context, ip net.IP, timeout time.Duration) ICMPResult {
	network, laddr, reqType, replyType := "ip4:icmp", "0.0.0.0", byte(icmpv4EchoRequest), byte(icmpv4EchoReply)
	if ip.To4() == nil {
		network, laddr, reqType, replyType = "ip6:ipv6-icmp", "::", icmpv6EchoRequest, icmpv6EchoReply
	}
	c, err := net.ListenPacket(network, laddr)
	if err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
			return ICMPNotPermitted
		}
		return ICMPResult("error: " + err.Error())
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	id, seq := uint16(rand.Uint32()), uint16(rand.Uint32())
	msg := echoMessage(reqType, id, seq, ip.To4() != nil)
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: ip}); err != nil {
		// A local firewall rejecting the packet also answers EPERM here;
		// that is not a missing capability, so it is reported as is.
		return ICMPResult("error: send: " + err.Error())
	}
	buf := make([]byte, 1500)
	for {
		n, peer, err := c.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return ICMPNoReply
			}
			return ICMPResult("error: receive: " + err.Error())
		}
		pa, ok := peer.(*net.IPAddr)
		if !ok || !pa.IP.Equal(ip) {
			continue
		}
		if isEchoReply(buf[:n], replyType, id, seq) {
			return ICMPReply
		}
	}
}

// echoMessage builds an echo request. The kernel computes the ICMPv6
// checksum of a raw ICMPv6 socket itself; ICMPv4 needs it here.
func echoMessage(typ byte, id, seq uint16, v4 bool) []byte {
	m := make([]byte, 8, 8+len(echoPayload))
	m[0] = typ
	m[4], m[5] = byte(id>>8), byte(id)
	m[6], m[7] = byte(seq>>8), byte(seq)
	m = append(m, echoPayload...)
	if v4 {
		cs := inetChecksum(m)
		m[2], m[3] = byte(cs>>8), byte(cs)
	}
	return m
}

// isEchoReply reports whether an ICMP message (IP header already removed)
// is the reply to our request.
func isEchoReply(m []byte, replyType byte, id, seq uint16) bool {
	return len(m) >= 8 && m[0] == replyType && m[1] == 0 &&
		uint16(m[4])<<8|uint16(m[5]) == id && uint16(m[6])<<8|uint16(m[7]) == seq
}

// inetChecksum is the RFC 1071 Internet checksum.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
