package iscsi

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
)

// The transport-neutral pieces the session heal is built on (package heal,
// session.go), tested through their exported API.
func TestHealStreaks(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	s := heal.NewStreaks(clk.Now)
	if d := s.Observe("a", true); d != 0 {
		t.Errorf("first sighting %v", d)
	}
	clk.Step(10 * time.Second)
	if d := s.Observe("a", true); d != 10*time.Second {
		t.Errorf("after 10 s: %v", d)
	}
	if d, ok := s.Held("a"); !ok || d != 10*time.Second {
		t.Errorf("Held %v %v", d, ok)
	}
	if d := s.Observe("a", false); d != 0 {
		t.Errorf("interrupted: %v", d)
	}
	clk.Step(time.Second)
	if d := s.Observe("a", true); d != 0 {
		t.Errorf("after an interruption the streak restarts: %v", d)
	}
	s.Sweep()
	clk.Step(time.Second)
	s.Observe("b", true)
	s.Sweep() // "a" was not observed since the last sweep
	if _, ok := s.Held("a"); ok {
		t.Error("an unobserved key survived the sweep")
	}
	if _, ok := s.Held("b"); !ok {
		t.Error("an observed key was swept")
	}
}

func TestHealWindow(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	w := heal.NewWindow(10*time.Minute, clk.Now)
	if left, _ := w.Left("n"); left != 0 {
		t.Errorf("unmarked: %v", left)
	}
	w.Mark("n")
	clk.Step(3 * time.Minute)
	if left, ago := w.Left("n"); left != 7*time.Minute || ago != 3*time.Minute {
		t.Errorf("3 min after: left %v ago %v", left, ago)
	}
	clk.Step(7 * time.Minute)
	w.Prune()
	if left, _ := w.Left("n"); left != 0 {
		t.Errorf("after the window: %v", left)
	}
}

func TestHealLogGate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	g := heal.NewLogGate(0, clk.Now)
	if !g.Should("k", "refused:portal unreachable") || g.Should("k", "refused:portal unreachable") {
		t.Error("an unchanged verdict must be logged once")
	}
	if !g.Should("k", "deferred:reachability") {
		t.Error("a changed verdict must be logged")
	}
	clk.Step(10 * time.Minute)
	if !g.Should("k", "deferred:reachability") {
		t.Error("an unchanged verdict is logged again after the relog interval")
	}
	g.Forget("k")
	if !g.Should("k", "deferred:reachability") {
		t.Error("a forgotten key is news")
	}
	if heal.RoundDuration(1234567*time.Microsecond) != 1200*time.Millisecond {
		t.Error("RoundDuration")
	}
}
