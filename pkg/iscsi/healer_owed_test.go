package iscsi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// timeoutErr is iscsiadm giving up on a login the target never answers
// (a disabled LIO portal group accepts TCP and rejects nothing: exit 8
// after ~47 s in the lab).
var timeoutErr = &CommandError{Command: "iscsiadm --login", Code: ExitTransportTimeout, kind: ErrTimeout}

// The time to LOGGED_IN counts from the start of the kick: a logout-login
// whose login hangs 30 s before it returns, seen LOGGED_IN one tick (1 s)
// later, took 31 s, not 1 s.
func TestHeal_TimeToLoggedInCountsFromTheKickStart(t *testing.T) {
	logs := captureLogs(t, "0")
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	r := newRig(t, nil)
	r.kicker.during = func() { r.clk.Step(30 * time.Second) }
	pv := rec("pv", iqnT, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	if rp := report(t, r.tick(45*time.Second, snap, pv), 2); rp.Verdict != heal.Kicked {
		t.Fatalf("%+v", rp)
	}
	rp := report(t, r.tick(time.Second, relogged(snap, 2, 7), pv), 7)
	if rp.Verdict != heal.Repaired || rp.TimeToLoggedIn != 31*time.Second || rp.Reason != "LOGGED_IN 31s after logout-login" {
		t.Fatalf("%+v", rp)
	}
	if out := logs.String(); !strings.Contains(out, `timeToLoggedIn="31s"`) {
		t.Errorf("verdict line lacks the time from the kick's start:\n%s", out)
	}
}

// Heal scope all: a session of a target pathmend never staged is logged
// out (its LUN has another live path) and the login fails. No record lists
// the portal, and iscsid does not retry a session that is gone, so the
// heal owes the node a login: it keeps trying, once per cooldown, each try
// a verdict line, until the session is back — and then stops.
func TestHeal_AFailedReloginIsLoggedInAgainUntilItIsBack(t *testing.T) {
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	gone := &Snapshot{Sessions: snap.Sessions[:1], Maps: []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda"}}}}
	back := relogged(snap, 2, 9)
	r := newRig(t, func(c *HealerConfig) { c.Scope = HealAll; c.ReloginCooldown = time.Minute })
	r.kicker.setLoginErr(timeoutErr)
	r.tick(0, snap)
	if rp := report(t, r.tick(45*time.Second, snap), 2); rp.Verdict != heal.Failed || rp.Kick != KickRelogin {
		t.Fatalf("relogin: %+v", rp)
	}
	// The node record has no session now; it is reported, owed, in
	// scope, and waits for the cooldown, not for iscsid.
	rp := report(t, r.tick(10*time.Second, gone), 0)
	if rp.State != SessionAbsent || !rp.Owed || !rp.InScope || rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "cooldown:") {
		t.Fatalf("after the failed relogin: %+v", rp)
	}
	if rp.Node.Portal.String() != "127.0.0.2:3260" || rp.DownFor != 10*time.Second {
		t.Fatalf("owed node %s down %s; want 127.0.0.2:3260 down since the kick (10s)", rp.Node, rp.DownFor)
	}
	var tries int
	for range 12 { // 2 min: a try per cooldown, each one failing
		if rp := report(t, r.tick(10*time.Second, gone), 0); rp.Verdict == heal.Failed {
			tries++
			if rp.Kick != KickLogin || !strings.Contains(rp.Reason, "pathmend logged the session out") || !strings.Contains(rp.Reason, "logs it in again after the cooldown") {
				t.Fatalf("retry: %+v", rp)
			}
		}
	}
	if tries != 2 {
		t.Errorf("%d failed logins in 2 min with a 1 min cooldown, want 2", tries)
	}
	// The target takes logins again: the next try brings it back.
	r.kicker.setLoginErr(nil)
	for i := 0; ; i++ {
		if rp := report(t, r.tick(10*time.Second, gone), 0); rp.Verdict == heal.Kicked {
			break
		}
		if i > 6 {
			t.Fatal("no login within a cooldown after the target healed")
		}
	}
	if rp := report(t, r.tick(2*time.Second, back), 9); rp.Verdict != heal.Repaired || rp.Kick != KickLogin {
		t.Fatalf("back: %+v", rp)
	}
	calls := len(r.kicker.Calls())
	for range 30 {
		for _, rp := range r.tick(10*time.Second, back) {
			if rp.State == SessionAbsent {
				t.Fatalf("a paid debt is still reported: %+v", rp)
			}
		}
	}
	if got := r.kicker.Calls(); len(got) != calls {
		t.Errorf("kicks after the session came back: %v", got[calls:])
	}
}

// A staged volume's failed relogin is owed as long as the volume is
// staged; once it is unstaged (its detach logged the portal out on
// purpose) the heal does not log it in again.
func TestHeal_AnUnstagedVolumeVoidsTheLoginDebt(t *testing.T) {
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	gone := &Snapshot{Sessions: snap.Sessions[:1]}
	r := newRig(t, func(c *HealerConfig) { c.ReloginCooldown = time.Minute })
	r.kicker.setLoginErr(timeoutErr)
	pv := rec("pv", iqnT, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	r.tick(45*time.Second, snap, pv)
	if rp := report(t, r.tick(10*time.Second, gone, pv), 0); !rp.Owed {
		t.Fatalf("staged: %+v", rp)
	}
	for range 20 {
		if rs := r.tick(10*time.Second, &Snapshot{}); len(rs) != 0 {
			t.Fatalf("unstaged, no session: %+v", rs)
		}
	}
	want := []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260"}
	if diff := cmp.Diff(want, r.kicker.Calls()); diff != "" {
		t.Errorf("kicks (-want +got):\n%s", diff)
	}
}

// A portal of a staged volume with no session, while the portal does not
// answer: iscsid has no session to retry, so the verdict is a deferral of
// pathmend's own login, not a refusal that leaves it to iscsid.
func TestHeal_AbsentSessionOnAnUnreachablePortalWaitsForIt(t *testing.T) {
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	r := newRig(t, nil)
	r.prober.set("127.0.0.2:3260", false)
	pv := rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	r.tick(0, snap, pv)
	rp := report(t, r.tick(time.Minute, snap, pv), 0)
	if rp.Verdict != heal.Deferred || !strings.HasPrefix(rp.Reason, "portal unreachable:") || !strings.Contains(rp.Reason, "pathmend logs in once the portal answers") {
		t.Fatalf("%+v", rp)
	}
}

// One tick's reports as node conditions: a portal that does not answer
// (PortalsUnreachable while the target's other portal is logged in,
// TargetUnreachable when it is the only one), and each session the heal
// cannot kick, with what to do: a rejected login, a session out of scope,
// a last path whose iscsid restart budget is spent, an owed login that
// keeps failing.
func TestNodeConditions_FromReports(t *testing.T) {
	down := Reachability{TCP: errors.New("connect: connection timed out"), TCPTime: 2 * time.Second}
	n := func(iqn, portal string) Node {
		return Node{Target: iqn, Portal: volume.Endpoint{Host: portal, Port: 3260}}
	}
	reports := []Report{
		{Session: 1, State: SessionLoggedIn, Node: n("iqn.a", "127.0.0.1")},
		{Session: 2, State: SessionFailed, Node: n("iqn.a", "127.0.0.2"), Probe: &down, Verdict: heal.Refused, Reason: "portal unreachable: …"},
		{State: SessionAbsent, Node: n("iqn.b", "127.0.0.3"), Probe: &down, Verdict: heal.Deferred, Reason: "portal unreachable: …"},
		{Session: 4, State: SessionFree, DownFor: time.Minute, Node: n("iqn.c", "127.0.0.4"), Verdict: heal.Refused, Class: heal.ClassLoginRejected, Reason: "login rejected by the target: exit 24"},
		{Session: 5, State: SessionFree, DownFor: time.Hour, Node: n("iqn.d", "127.0.0.5"), Verdict: heal.Refused, Class: heal.ClassOutOfScope, Reason: "out of scope: no staged volume uses target iqn.d"},
		{Session: 6, State: SessionFailed, DownFor: 2 * time.Minute, Node: n("iqn.e", "127.0.0.6"), Verdict: heal.Deferred, Class: heal.ClassRestartCooldown, Reason: "restart cooldown: iscsid restarted 1m ago"},
		{State: SessionAbsent, Owed: true, DownFor: 3 * time.Minute, Node: n("iqn.f", "127.0.0.7"), Verdict: heal.Failed, Class: heal.ClassKickFailed, Reason: "login failed; chosen because …"},
		{Session: 8, State: SessionFailed, DownFor: 20 * time.Second, Node: n("iqn.g", "127.0.0.8")}, // iscsid's to recover still
	}
	cs := NodeConditions(reports)
	var got []string
	for _, c := range cs {
		got = append(got, fmt.Sprintf("%s %s", c.Status, c.Reason))
	}
	want := []string{"Degraded PortalsUnreachable", "Inaccessible TargetUnreachable", "Degraded ISCSISessionStuck"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if !strings.Contains(cs[0].Message, "iSCSI target iqn.a: 1 of 2 portals do not answer") || !strings.Contains(cs[1].Message, "iqn.b: 1 of 1 portals") {
		t.Errorf("unreachable messages: %q; %q", cs[0].Message, cs[1].Message)
	}
	stuck := cs[2].Message
	for _, s := range []string{"session4 to iqn.c", "fix its CHAP credentials or ACL", "session5 to iqn.d", "--heal-iscsi-scope=all",
		"session6 to iqn.e", "restart iscsid by hand", "no session to iqn.f", "pathmend logged the session out"} {
		if !strings.Contains(stuck, s) {
			t.Errorf("stuck message lacks %q:\n%s", s, stuck)
		}
	}
	if strings.Contains(stuck, "iqn.g") {
		t.Errorf("a session iscsid may still recover is reported stuck:\n%s", stuck)
	}
}
