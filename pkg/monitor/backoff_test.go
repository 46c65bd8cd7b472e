package monitor

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func TestBackoff_DoublesCapsAndResets(t *testing.T) {
	b := newBackoff(time.Second, 8*time.Second)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var waits []time.Duration
	for range 6 {
		if ok, _, _, _ := b.ready("ep", now); !ok {
			t.Fatal("not ready at its retry time")
		}
		until := b.failure("ep", now, errors.New("i/o timeout"), true)
		waits = append(waits, until.Sub(now))
		if ok, _, lastErr, recheck := b.ready("ep", now.Add(until.Sub(now)-time.Millisecond)); ok || lastErr != "i/o timeout" || !recheck {
			t.Fatalf("ready before its backoff ran out (ok=%t, lastErr=%q, recheck=%t)", ok, lastErr, recheck)
		}
		now = until
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for i := range want {
		if waits[i] != want[i]*time.Second {
			t.Errorf("wait %d = %v, want %v", i, waits[i], want[i]*time.Second)
		}
	}
	b.success("ep")
	if ok, _, _, _ := b.ready("ep", now); !ok || b.len() != 0 {
		t.Error("success did not reset the backoff")
	}
	b.failure("a", now, nil, false)
	b.failure("b", now, nil, false)
	b.prune(map[string]bool{"a": true})
	if b.len() != 1 {
		t.Errorf("prune kept %d keys, want 1", b.len())
	}
}

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
