package heal

import (
	"errors"
	"testing"
	"time"
)

func TestBackoff_DoublesCapsAndResets(t *testing.T) {
	b := NewBackoff(time.Second, 8*time.Second)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var waits []time.Duration
	for range 6 {
		if ok, _, _, _ := b.Ready("ep", now); !ok {
			t.Fatal("not ready at its retry time")
		}
		until := b.Failure("ep", now, errors.New("i/o timeout"), true)
		waits = append(waits, until.Sub(now))
		if ok, _, lastErr, recheck := b.Ready("ep", now.Add(until.Sub(now)-time.Millisecond)); ok || lastErr != "i/o timeout" || !recheck {
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
	b.Success("ep")
	if ok, _, _, _ := b.Ready("ep", now); !ok || b.Len() != 0 {
		t.Error("success did not reset the backoff")
	}
	b.Failure("a", now, nil, false)
	b.Failure("b", now, nil, false)
	b.Prune(func(k string) bool { return k == "a" })
	if b.Len() != 1 {
		t.Errorf("prune kept %d keys, want 1", b.Len())
	}
}
