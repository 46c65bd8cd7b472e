package iscsi

import (
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
)

// memStamps is a Stamps in memory, shared by the healers of one test as a
// state directory is by the pathmend processes of one node.
type memStamps struct{ m map[string]time.Time }

func (s *memStamps) Stamp(name string) (time.Time, bool, error) {
	t, ok := s.m[name]
	return t, ok, nil
}

func (s *memStamps) SetStamp(name string, t time.Time) error {
	if s.m == nil {
		s.m = map[string]time.Time{}
	}
	s.m[name] = t
	return nil
}

// With the process's heal.Policy, the session heal takes its mode from it
// and keeps its login and relogin cooldowns in the policy's table, under
// the node record's key (the SessionDown defect key of diagnose), with the
// policy's cooldown period.
func TestHeal_PolicyGivesTheModeAndHoldsTheCooldown(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	var clk *clocktesting.FakeClock
	var policy *heal.Policy
	r := newRig(t, func(c *HealerConfig) {
		clk = clocktesting.NewFakeClock(t0)
		p, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Cooldown: 5 * time.Minute, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		policy = p
		c.Policy, c.Mode, c.Now = p, "", clk.Now
	})
	r.clk = clk
	pv := rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	if rp := report(t, r.tick(45*time.Second, snap, pv), 2); rp.Verdict != heal.Kicked || rp.Kick != KickRelogin {
		t.Fatalf("kick: %+v", rp)
	}
	key := lostIQN + " 127.0.0.2:3260 default"
	if left, _ := policy.Left(key); left != 5*time.Minute {
		t.Fatalf("policy cooldown of %q: %s left, want 5m", key, left)
	}
	// Still down past the verify window (2 min): failed; the policy's
	// cooldown (5 min, not the healer's default 2 min) defers the next.
	r.tick(2*time.Minute, snap, pv)
	rp := report(t, r.tick(time.Minute, snap, pv), 2)
	if rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "cooldown: kicked 3m0s ago, 2m0s left") {
		t.Fatalf("3 min after the kick: %+v", rp)
	}
	if n := len(r.kicker.Calls()); n != 2 {
		t.Fatalf("kicks %v", r.kicker.Calls())
	}
}

func TestHeal_PolicyAndModeMustAgree(t *testing.T) {
	p, err := heal.NewPolicy(heal.Config{Mode: heal.ModeObserve})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []HealerConfig{
		{Policy: p, Mode: heal.ModeRepair},
		{Policy: p, ReloginCooldown: time.Minute},
	} {
		cfg.Kicker, cfg.Prober = &fakeKicker{}, &fakeProber{}
		if _, err := NewSessionHealer(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	h, err := NewSessionHealer(HealerConfig{Policy: p, Kicker: &fakeKicker{}, Prober: &fakeProber{}})
	if err != nil || h.cfg.Mode != heal.ModeObserve {
		t.Fatalf("mode %q, %v; want the policy's observe", h.cfg.Mode, err)
	}
}

// The restart budget is stamped in the state directory: a pathmend
// restarted 3 minutes after it restarted iscsid defers the next restart
// for the 7 minutes left, instead of restarting again at once.
func TestHeal_RestartBudgetSurvivesARestartOfPathmend(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	stamps := &memStamps{}
	pv := rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")
	first := newRig(t, func(c *HealerConfig) { c.Stamps = stamps })
	first.tick(0, snap, pv)
	if rp := report(t, first.tick(45*time.Second, snap, pv), 2); rp.Kick != KickRestart || rp.Verdict != heal.Kicked {
		t.Fatalf("first pathmend: %+v", rp)
	}
	at, ok, _ := stamps.Stamp(restartStamp)
	if !ok || !at.Equal(t0.Add(45*time.Second)) {
		t.Fatalf("stamp %v %v, want %v", at, ok, t0.Add(45*time.Second))
	}

	second := newRig(t, func(c *HealerConfig) { c.Stamps = stamps })
	second.clk.SetTime(at.Add(3 * time.Minute))
	second.tick(0, snap, pv)
	rp := report(t, second.tick(45*time.Second, snap, pv), 2)
	if rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "restart cooldown: iscsid restarted 3m45s ago, 6m15s left") {
		t.Fatalf("restarted pathmend: %+v", rp)
	}
	if c := second.kicker.Calls(); len(c) != 0 {
		t.Fatalf("restarted pathmend kicked: %v", c)
	}
}
