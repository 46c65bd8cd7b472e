package iscsi

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

func endpointOf(t *testing.T, addr net.Addr) volume.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return volume.Endpoint{Host: host, Port: uint16(p)}
}

// A listening portal is reachable; a closed port is not, with the errno
// kept; the ICMP result is recorded beside, whatever it is.
func TestNetProber_TCPDecidesICMPIsRecorded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := endpointOf(t, l.Addr())
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closedL, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := endpointOf(t, closedL.Addr())
	closedL.Close()
	defer l.Close()

	p := &NetProber{Timeout: time.Second, ping: func(context.Context, net.IP, time.Duration) ICMPResult { return ICMPNoReply }}
	r := p.Probe(context.Background(), open)
	if !r.Reachable() || r.ICMP != ICMPNoReply {
		t.Errorf("open port: %+v", r)
	}
	r = p.Probe(context.Background(), closed)
	if r.Reachable() || !errors.Is(r.TCP, syscall.ECONNREFUSED) || r.TCPString() != "connect: connection refused" {
		t.Errorf("closed port: %+v (%s)", r, r.TCPString())
	}
	if r := p.Probe(context.Background(), volume.Endpoint{Host: "target.example", Port: 3260}); r.Reachable() || r.ICMP != ICMPSkipped {
		t.Errorf("host name: %+v", r)
	}
	if r := (&NetProber{NoICMP: true}).Probe(context.Background(), open); r.ICMP != ICMPSkipped || !r.Reachable() {
		t.Errorf("NoICMP: %+v", r)
	}
}

// The real echo on loopback: a reply with CAP_NET_RAW, "not permitted"
// without; both are honest answers, anything else is a bug.
func TestICMPEcho_Loopback(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "::1"} {
		got := icmpEcho(context.Background(), net.ParseIP(ip), time.Second)
		if got != ICMPReply && got != ICMPNotPermitted {
			t.Errorf("%s: %q", ip, got)
		}
	}
}

func TestEchoMessage(t *testing.T) {
	m := echoMessage(icmpv4EchoRequest, 0x1234, 0x0102, true)
	if inetChecksum(m) != 0 {
		t.Errorf("checksum of a checksummed message is %#x, want 0", inetChecksum(m))
	}
	reply := append([]byte(nil), m...)
	reply[0] = icmpv4EchoReply
	if !isEchoReply(reply, icmpv4EchoReply, 0x1234, 0x0102) || isEchoReply(reply, icmpv4EchoReply, 0x1234, 0x0103) || isEchoReply(m, icmpv4EchoReply, 0x1234, 0x0102) || isEchoReply(reply[:7], icmpv4EchoReply, 0x1234, 0x0102) {
		t.Error("isEchoReply")
	}
	if inetChecksum([]byte{0x45, 0x00, 0x00}) != ^uint16(0x4500) {
		t.Error("odd length checksum")
	}
}
