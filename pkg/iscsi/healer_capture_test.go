package iscsi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The session heal replayed on the lab's captures.

const (
	healthyIQN = "iqn.2024-01.io.pathmend.lab:healthy"
	failingIQN = "iqn.2024-01.io.pathmend.lab:failing"
	lostIQN    = "iqn.2024-01.io.pathmend.lab:lost"
	stuckIQN   = "iqn.2024-01.io.pathmend.lab:stuck"
)

// The most important heal test: on the healthy capture, with both LUNs
// staged, an hour of ticks does nothing at all — no kick, not even a probe.
func TestHeal_HealthyCaptureNeverActs(t *testing.T) {
	snap := readCapture(t, "iscsi-healthy")
	r := newRig(t, nil)
	recs := []volume.Record{
		rec("pv-0", healthyIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2"),
		rec("pv-1", healthyIQN, 1, "/dev/dm-1", "127.0.0.1", "127.0.0.2"),
	}
	for range 360 {
		for _, rp := range r.tick(10*time.Second, snap, recs...) {
			if rp.Verdict != "" || rp.Kick != "" || rp.State != SessionLoggedIn || !rp.InScope {
				t.Fatalf("healthy session got %+v", rp)
			}
		}
	}
	if c := r.kicker.Calls(); len(c) != 0 || r.prober.probes != 0 {
		t.Fatalf("healthy capture: kicks %v, probes %d", c, r.prober.probes)
	}
}

// The ladder on the real FAILED and FREE captures (no multipathd, one LUN
// seen as sda through 127.0.0.1 and sdb through the stuck 127.0.0.2): the
// volume's device decides whether the stuck session is its last path.
func TestHeal_LadderOnTheFailedAndFreeCaptures(t *testing.T) {
	for _, tc := range []struct {
		capture, iqn, device string
		want                 []string
		kick                 Kick
	}{
		// The volume is mounted from sda: losing sdb strands nobody.
		{"iscsi-session-failed", failingIQN, "/dev/sda", []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260"}, KickRelogin},
		{"iscsi-session-free", lostIQN, "/dev/sda", []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260"}, KickRelogin},
		// The volume is mounted from sdb, the stuck session's only disk:
		// never log it out; restart iscsid (devices kept).
		{"iscsi-session-failed", failingIQN, "/dev/sdb", []string{"restart"}, KickRestart},
		{"iscsi-session-free", lostIQN, "/dev/sdb", []string{"restart"}, KickRestart},
		// A record without a device, or naming a device this LUN has no
		// name for, counts as using it.
		{"iscsi-session-free", lostIQN, "", []string{"restart"}, KickRestart},
		{"iscsi-session-free", lostIQN, "/dev/disk/by-id/wwn-0x6001405", []string{"restart"}, KickRestart},
	} {
		t.Run(tc.capture+tc.device, func(t *testing.T) {
			snap := readCapture(t, tc.capture)
			r := newRig(t, nil)
			pv := rec("pv", tc.iqn, 0, tc.device, "127.0.0.1", "127.0.0.2")
			rp := report(t, r.tick(0, snap, pv), 2)
			if rp.Verdict != "" || rp.Probe == nil || !rp.Probe.Reachable() {
				t.Fatalf("first sighting: %+v", rp)
			}
			rp = report(t, r.tick(30*time.Second, snap, pv), 2)
			if rp.Verdict != "" || len(r.kicker.Calls()) != 0 {
				t.Fatalf("30 s down: %+v, kicks %v", rp, r.kicker.Calls())
			}
			rp = report(t, r.tick(16*time.Second, snap, pv), 2)
			if rp.Verdict != heal.Kicked || rp.Kick != tc.kick || rp.DownFor != 46*time.Second || rp.ReachableFor != 46*time.Second {
				t.Fatalf("46 s down and reachable: %+v", rp)
			}
			if diff := cmp.Diff(tc.want, r.kicker.Calls()); diff != "" {
				t.Fatalf("kicks (-want +got):\n%s", diff)
			}
			// The session comes back (a relogin makes a new one).
			back := withState(snap, 2, SessionLoggedIn)
			if tc.kick == KickRelogin {
				back = relogged(snap, 2, 3)
			}
			rp = report(t, r.tick(5*time.Second, back, pv), map[Kick]SessionID{KickRelogin: 3, KickRestart: 2}[tc.kick])
			if rp.Verdict != heal.Repaired || rp.TimeToLoggedIn != 5*time.Second || rp.Kick != tc.kick {
				t.Fatalf("after recovery: %+v", rp)
			}
			if len(r.kicker.Calls()) != len(tc.want) {
				t.Fatalf("kicked again: %v", r.kicker.Calls())
			}
		})
	}
}

// When some staged-volume records cannot be read, the readable ones say
// nothing about the LUNs the unreadable ones may use: the free capture's
// stuck session, whose disk sdb the readable volume does not use (a
// relogin with complete records), is then the last path of a disk that
// may be in use — iscsid is restarted, the session never logged out. A
// LUN with another live path would still be relogged in.
func TestHeal_IncompleteRecordsNeverLogOutALastPath(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	r := newRig(t, nil)
	pv := rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")
	unreadable := errors.New("staged-volume record pv-x.json: unexpected end of JSON input")
	tick := func(d time.Duration) Report {
		r.clk.Step(d)
		return report(t, checkClasses(t, tickHealer(context.Background(), r.h, r.jobs, snap, []volume.Record{pv}, unreadable)), 2)
	}
	tick(0)
	rp := tick(45 * time.Second)
	if rp.Verdict != heal.Kicked || rp.Kick != KickRestart || !strings.Contains(rp.Reason, "some staged-volume records could not be read") {
		t.Fatalf("with unreadable records: %+v", rp)
	}
	if diff := cmp.Diff([]string{"restart"}, r.kicker.Calls()); diff != "" {
		t.Fatalf("kicks (-want +got):\n%s", diff)
	}
}

// The really stuck session (open-iscsi #387) captured beside a live path
// of one multipath map, the volume on the map: 44 s down with the portal
// reachable is not enough, the 45 s threshold is; the kick is a logout of
// session2 alone and a login of its node record (127.0.0.3, the portal
// the session was logged in through), never a restart, never session1.
func TestHeal_StuckCaptureIsReloggedInBesideTheLivePath(t *testing.T) {
	snap := readCapture(t, "iscsi-session-stuck")
	r := newRig(t, nil)
	pv := rec("pv", stuckIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.3")
	for _, step := range []time.Duration{0, 30 * time.Second, 14 * time.Second} {
		rs := r.tick(step, snap, pv)
		if rp := report(t, rs, 2); rp.Verdict != "" {
			t.Fatalf("%s into the outage: %+v", rp.DownFor, rp)
		}
		if rp := report(t, rs, 1); rp.Verdict != "" || rp.State != SessionLoggedIn {
			t.Fatalf("the live session: %+v", rp)
		}
	}
	rp := report(t, r.tick(time.Second, snap, pv), 2)
	if rp.Verdict != heal.Kicked || rp.Kick != KickRelogin || rp.DownFor != 45*time.Second || rp.ReachableFor != 45*time.Second {
		t.Fatalf("45 s down and reachable: %+v", rp)
	}
	if want := []string{"logout session2 127.0.0.3:3260", "login 127.0.0.3:3260"}; !cmp.Equal(want, r.kicker.Calls()) {
		t.Fatalf("kicks %v, want %v", r.kicker.Calls(), want)
	}
	rp = report(t, r.tick(5*time.Second, relogged(snap, 2, 3), pv), 3)
	if rp.Verdict != heal.Repaired || rp.TimeToLoggedIn != 5*time.Second {
		t.Fatalf("after the relogin: %+v", rp)
	}
}

// The heal never writes to sysfs — in particular never recovery_tmo,
// which the kernel refuses with EBUSY on a FAILED or FREE session.
func TestHeal_NeverTouchesRecoveryTmo(t *testing.T) {
	fsys := capture(t, "iscsi-session-free")
	tmo := fsys.Path("class/iscsi_session/session2/recovery_tmo")
	before, err := os.Stat(tmo)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, nil)
	pv := rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")
	for range 10 {
		snap, err := Read(fsys, r.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		r.tick(30*time.Second, snap, pv)
	}
	after, _ := os.Stat(tmo)
	v, _ := os.ReadFile(filepath.Clean(tmo))
	if !after.ModTime().Equal(before.ModTime()) || string(v) != "5\n" {
		t.Errorf("recovery_tmo changed: %q", v)
	}
	if len(r.kicker.Calls()) == 0 {
		t.Error("the stuck session was not kicked at all")
	}
}
