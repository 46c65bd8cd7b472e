package iscsi

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Multipath with another live path: the stuck session is logged out and
// in; the map keeps serving through the other path.
func TestHeal_MultipathWithAnotherLivePathLogsOutAndIn(t *testing.T) {
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	r := newRig(t, nil)
	pv := rec("pv", iqnT, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	rp := report(t, r.tick(45*time.Second, snap, pv), 2)
	if rp.Kick != KickRelogin || rp.Verdict != heal.Kicked || !strings.Contains(rp.Reason, "another live path sda") {
		t.Fatalf("%+v", rp)
	}
	want := []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260"}
	if diff := cmp.Diff(want, r.kicker.Calls()); diff != "" {
		t.Fatalf("kicks (-want +got):\n%s", diff)
	}
}

// Both paths of an in-use map stuck: one iscsid restart for both, never a
// logout; the map (or anything else) holding the device makes it in use.
func TestHeal_AllPathsStuckRestartOnceAndNeverLogOut(t *testing.T) {
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionFailed, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	for _, device := range []string{"/dev/dm-0", "/dev/mapper/mpatha"} {
		r := newRig(t, nil)
		pv := rec("pv", iqnT, 0, device, "127.0.0.1", "127.0.0.2")
		r.tick(0, snap, pv)
		rs := r.tick(50*time.Second, snap, pv)
		for _, id := range []SessionID{1, 2} {
			if rp := report(t, rs, id); rp.Kick != KickRestart || rp.Verdict != heal.Kicked {
				t.Errorf("%s: session %d: %+v", device, id, rp)
			}
		}
		if diff := cmp.Diff([]string{"restart"}, r.kicker.Calls()); diff != "" {
			t.Errorf("%s: kicks (-want +got):\n%s", device, diff)
		}
	}
	// Unstaged LUN, but something is stacked on the map (LVM): in use.
	held := *snap
	held.Maps = []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}, Holders: []string{"dm-3"}}}
	r := newRig(t, nil)
	pv := rec("pv", iqnT, 5, "/dev/dm-9", "127.0.0.1", "127.0.0.2") // another LUN of the target
	r.tick(0, &held, pv)
	if rp := report(t, r.tick(50*time.Second, &held, pv), 1); rp.Kick != KickRestart || !strings.Contains(rp.Reason, "held by dm-3") {
		t.Errorf("held map: %+v", rp)
	}
}

// A portal that does not accept TCP is refused however long it lasts:
// iscsid retries by itself, and no kick can reach an unreachable target.
func TestHeal_UnreachablePortalIsRefused(t *testing.T) {
	snap := readCapture(t, "iscsi-session-failed")
	r := newRig(t, nil)
	r.prober.set("127.0.0.2:3260", false)
	pv := rec("pv", failingIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	var rp Report
	for range 120 {
		rp = report(t, r.tick(30*time.Second, snap, pv), 2)
	}
	if rp.Verdict != heal.Refused || !strings.HasPrefix(rp.Reason, "portal unreachable: connect: connection timed out") || rp.ReachableFor != 0 {
		t.Fatalf("%+v", rp)
	}
	if c := r.kicker.Calls(); len(c) != 0 {
		t.Fatalf("kicked an unreachable portal: %v", c)
	}
}

// Reachability must be continuous: one failed probe restarts its clock.
func TestHeal_AFlapResetsTheReachableClock(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	r := newRig(t, nil)
	pv := rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	step := func(reachable bool) Report {
		r.prober.set("127.0.0.2:3260", reachable)
		return report(t, r.tick(20*time.Second, snap, pv), 2)
	}
	step(true)  // 20 s
	step(true)  // 40 s
	step(false) // 60 s: flap
	step(true)  // 80 s: streak restarts
	rp := step(true)
	if rp.Verdict != heal.Deferred || rp.ReachableFor != 20*time.Second || !strings.HasPrefix(rp.Reason, "reachability:") {
		t.Fatalf("20 s after the flap: %+v", rp)
	}
	step(true) // 40 s after the flap
	if c := r.kicker.Calls(); len(c) != 0 {
		t.Fatalf("kicked before 45 s of continuous reachability: %v", c)
	}
	if rp := step(true); rp.Verdict != heal.Kicked || rp.ReachableFor != 60*time.Second {
		t.Fatalf("60 s after the flap: %+v", rp)
	}
}

// A restart is taken at most once per cooldown window per node, and a
// kick that does not bring the session back within the verify window is
// a failure.
func TestHeal_RestartCooldownAndVerifyWindow(t *testing.T) {
	snap := readCapture(t, "iscsi-session-failed")
	r := newRig(t, nil)
	pv := rec("pv", failingIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	restartsAt := []time.Duration{}
	var failed, deferred int
	for elapsed := time.Duration(0); elapsed < 25*time.Minute; {
		elapsed += 15 * time.Second
		before := len(r.kicker.Calls())
		rp := report(t, r.tick(15*time.Second, snap, pv), 2)
		if len(r.kicker.Calls()) > before {
			restartsAt = append(restartsAt, elapsed)
		}
		switch {
		case rp.Verdict == heal.Failed:
			failed++
			if !strings.Contains(rp.Reason, "not LOGGED_IN") {
				t.Errorf("failure reason %q", rp.Reason)
			}
		case rp.Verdict == heal.Deferred && strings.HasPrefix(rp.Reason, "restart cooldown:"):
			deferred++
		}
	}
	want := []time.Duration{45 * time.Second, 10*time.Minute + 45*time.Second, 20*time.Minute + 45*time.Second}
	if diff := cmp.Diff(want, restartsAt); diff != "" {
		t.Errorf("restarts at (-want +got):\n%s", diff)
	}
	if failed != 3 || deferred == 0 {
		t.Errorf("failed %d (want 3), deferred %d", failed, deferred)
	}
	for _, c := range r.kicker.Calls() {
		if c != "restart" {
			t.Fatalf("last path logged out: %v", r.kicker.Calls())
		}
	}
}

// iscsid is not restarted under a running login or logout; the restart
// budget is not spent, so the next tick tries again.
func TestHeal_RestartWaitsForLoginsInFlight(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	r := newRig(t, nil)
	pv := rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	r.kicker.restartErr = ErrInFlight
	if rp := report(t, r.tick(50*time.Second, snap, pv), 2); rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "in flight:") {
		t.Fatalf("%+v", rp)
	}
	r.kicker.restartErr = nil
	if rp := report(t, r.tick(10*time.Second, snap, pv), 2); rp.Verdict != heal.Kicked || rp.Kick != KickRestart {
		t.Fatalf("%+v", rp)
	}
}

// Narrowest first: a relogin and a restart due in the same tick — the
// relogin runs, the restart waits for a fresh look.
func TestHeal_NarrowestKickFirst(t *testing.T) {
	snap := &Snapshot{Sessions: []Session{
		sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")),
		sess(2, SessionFailed, "127.0.0.2", disk(0, "sdb")),
		sess(3, SessionFailed, "127.0.0.3", disk(1, "sdc")),
	}}
	r := newRig(t, nil)
	pvs := []volume.Record{
		rec("pv-a", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2"),
		rec("pv-b", iqnT, 1, "/dev/sdc", "127.0.0.3"),
	}
	r.tick(0, snap, pvs...)
	rs := r.tick(45*time.Second, snap, pvs...)
	if rp := report(t, rs, 2); rp.Kick != KickRelogin || rp.Verdict != heal.Kicked {
		t.Errorf("session2: %+v", rp)
	}
	if rp := report(t, rs, 3); rp.Kick != KickRestart || rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "narrowest first") {
		t.Errorf("session3: %+v", rp)
	}
	rs = r.tick(10*time.Second, snap, pvs...)
	if rp := report(t, rs, 3); rp.Verdict != heal.Kicked {
		t.Errorf("session3 next tick: %+v", rp)
	}
	want := []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260", "restart"}
	if diff := cmp.Diff(want, r.kicker.Calls()); diff != "" {
		t.Errorf("kicks (-want +got):\n%s", diff)
	}
}

// A portal of a staged volume without any session is logged in (the
// narrowest kick of all); a login the target rejects (CHAP, ACL) is not
// retried.
func TestHeal_AbsentSessionIsLoggedInUnlessTheTargetRejectsIt(t *testing.T) {
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	r := newRig(t, func(c *HealerConfig) { c.ReloginCooldown = time.Minute })
	pv := rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	if rp := report(t, r.tick(0, snap, pv), 0); rp.State != SessionAbsent || rp.Node.Portal.String() != "127.0.0.2:3260" {
		t.Fatalf("%+v", rp)
	}
	r.kicker.loginErr = &CommandError{Command: "iscsiadm --login", Code: ExitLoginAuthFailed, kind: ErrAuthFailed}
	if rp := report(t, r.tick(45*time.Second, snap, pv), 0); rp.Kick != KickLogin || rp.Verdict != heal.Failed {
		t.Fatalf("%+v", rp)
	}
	for range 10 {
		rp := report(t, r.tick(2*time.Minute, snap, pv), 0)
		if rp.Verdict != heal.Refused || !strings.HasPrefix(rp.Reason, "login rejected by the target:") {
			t.Fatalf("%+v", rp)
		}
	}
	if diff := cmp.Diff([]string{"login 127.0.0.2:3260"}, r.kicker.Calls()); diff != "" {
		t.Errorf("kicks (-want +got):\n%s", diff)
	}
}

// Every session is observed and reported; only staged targets are kicked
// unless the scope is all — and a foreign last path is never logged out.
func TestHeal_Scope(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	r := newRig(t, nil)
	r.tick(0, snap)
	rp := report(t, r.tick(time.Hour, snap), 2)
	if rp.InScope || rp.Verdict != heal.Refused || !strings.HasPrefix(rp.Reason, "out of scope:") || rp.Probe != nil {
		t.Fatalf("staged scope, no volumes: %+v", rp)
	}
	if len(r.kicker.Calls()) != 0 || r.prober.probes != 0 {
		t.Fatal("acted or probed out of scope")
	}
	all := newRig(t, func(c *HealerConfig) { c.Scope = HealAll })
	all.tick(0, snap)
	rp = report(t, all.tick(time.Minute, snap), 2)
	if !rp.InScope || rp.Kick != KickRestart || !strings.Contains(rp.Reason, "not staged by pathmend") {
		t.Fatalf("scope all, foreign last path: %+v", rp)
	}
}

func TestHeal_ObserveAndOffModes(t *testing.T) {
	snap := readCapture(t, "iscsi-session-failed")
	pv := rec("pv", failingIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	obs := newRig(t, func(c *HealerConfig) { c.Mode = heal.ModeObserve })
	obs.tick(0, snap, pv)
	for range 5 {
		rp := report(t, obs.tick(time.Minute, snap, pv), 2)
		if rp.Verdict != heal.Observed || rp.Kick != KickRelogin || !strings.HasPrefix(rp.Reason, "observe mode: would logout-login") {
			t.Fatalf("observe: %+v", rp)
		}
	}
	off := newRig(t, func(c *HealerConfig) { c.Mode = heal.ModeOff })
	if rs := off.tick(time.Hour, snap, pv); rs != nil {
		t.Fatalf("off: %+v", rs)
	}
	if len(obs.kicker.Calls())+len(off.kicker.Calls())+off.prober.probes != 0 {
		t.Fatal("observe or off acted")
	}
}

// One line per verdict: a refusal repeated every tick is logged once; a
// kick is logged once, when its outcome is known, with every field.
func TestHeal_LogsEachVerdictOnceWithItsFields(t *testing.T) {
	logs := captureLogs(t, "0")
	snap := readCapture(t, "iscsi-session-failed")
	r := newRig(t, nil)
	pv := rec("pv-1", failingIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")
	r.prober.set("127.0.0.2:3260", false)
	for range 20 {
		r.tick(10*time.Second, snap, pv)
	}
	r.prober.set("127.0.0.2:3260", true)
	for range 6 { // reachable 0 s … 50 s: kicked at 50 s
		r.tick(10*time.Second, snap, pv)
	}
	r.tick(10*time.Second, withState(snap, 2, SessionLoggedIn), pv)
	klog.Flush()
	out := logs.String()
	for what, n := range map[string]int{`verdict="refused"`: 1, `verdict="deferred"`: 1, `verdict="repaired"`: 1, `verdict="kicked"`: 0,
		`result="not kicked"`: 2, `result="LOGGED_IN"`: 1} {
		if got := strings.Count(out, what); got != n {
			t.Errorf("%s logged %d times, want %d:\n%s", what, got, n, out)
		}
	}
	for _, kv := range []string{`session="session2"`, `target="` + failingIQN + `"`, `portal="127.0.0.2:3260"`, `state="FAILED"`,
		`timeInState=`, `downFor=`, `tcp="connected in 1ms"`, `icmp="not permitted"`, `reachableFor="50s"`, `kick="restart-iscsid"`,
		`result="LOGGED_IN"`, `timeToLoggedIn="10s"`, `volumes="pv-1"`, `mode="repair"`} {
		if !strings.Contains(out, kv) {
			t.Errorf("verdict lines lack %s:\n%s", kv, out)
		}
	}
}

// DownFor feeds the attacher's health message.
func TestHeal_DownForIsTheObservedTime(t *testing.T) {
	snap := readCapture(t, "iscsi-session-failed")
	r := newRig(t, func(c *HealerConfig) { c.Mode = heal.ModeObserve })
	r.tick(0, snap)
	r.tick(40*time.Second, snap)
	if d, ok := r.h.DownFor(2); !ok || d != 40*time.Second {
		t.Errorf("DownFor(2) = %v %v", d, ok)
	}
	if _, ok := r.h.DownFor(1); ok {
		t.Error("session1 is up")
	}
}

func TestNewSessionHealer_Validates(t *testing.T) {
	ok := HealerConfig{Mode: heal.ModeRepair, Kicker: &fakeKicker{}, Prober: &fakeProber{}}
	for name, mod := range map[string]func(*HealerConfig){
		"mode":      func(c *HealerConfig) { c.Mode = "fix" },
		"scope":     func(c *HealerConfig) { c.Scope = "some" },
		"kicker":    func(c *HealerConfig) { c.Kicker = nil },
		"prober":    func(c *HealerConfig) { c.Prober = nil },
		"threshold": func(c *HealerConfig) { c.Threshold = -time.Second },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := NewSessionHealer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
