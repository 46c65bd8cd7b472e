package nvmeheal

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestTCPProber(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	p := TCPProber{Timeout: time.Second}
	if err := p.Reachable(context.Background(), addr); err != nil {
		t.Errorf("listening endpoint unreachable: %v", err)
	}
	l.Close()
	if err := p.Reachable(context.Background(), addr); err == nil {
		t.Error("closed endpoint reachable")
	}
}
