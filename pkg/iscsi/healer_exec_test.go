package iscsi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The argv the real Initiator runs for the heal's kicks, through the
// nsenter prefix of newInitiator.
func logoutArgv(sid int) []string {
	return append(slices.Clone(nsenter), "iscsiadm", "-m", "session", "-r", strconv.Itoa(sid), "-u")
}

func loginArgv(iqn, portal string) []string {
	return append(slices.Clone(nsenter), "iscsiadm", "-m", "node", "-T", iqn, "-p", portal, "-I", "default", "--login")
}

func restartArgv() []string {
	return append(slices.Clone(nsenter), "systemctl", "restart", "iscsid")
}

// withoutSession returns a copy of snap without session id: what sysfs
// shows after iscsiadm logged it out.
func withoutSession(snap *Snapshot, id SessionID) *Snapshot {
	c := *snap
	c.Sessions = slices.DeleteFunc(slices.Clone(snap.Sessions), func(s Session) bool { return s.ID == id })
	return &c
}

// The heal ladder replayed on the lab's captures, driving the real
// Initiator over a fake exec: what is asserted is the exact argv that
// would have run on the node, tick after tick, and the verdict of the
// session the case is about. Every other report must stay quiet.
func TestHeal_LadderThroughTheInitiatorOnFakeExec(t *testing.T) {
	// step is one or more ticks after the same clock step, on the same
	// snapshot, with the same expectations after each.
	type step struct {
		after  time.Duration
		repeat int // ticks; 1 when zero
		// snap derives the tick's snapshot from the capture; nil is the
		// capture as is.
		snap func(*Snapshot) *Snapshot
		// session is the report checked (0: the absent portal).
		session SessionID
		verdict heal.Verdict
		kick    Kick
		reason  string // prefix; "" checks nothing
		errIs   error  // nil: the report carries no error
		// argv is every command run so far, in order.
		argv [][]string
	}
	reloggedAs3 := func(s *Snapshot) *Snapshot { return relogged(s, 2, 3) }
	back := func(s *Snapshot) *Snapshot { return withState(s, 2, SessionLoggedIn) }
	dropped := func(s *Snapshot) *Snapshot { return withoutSession(s, 2) }
	loginLost2 := loginArgv(lostIQN, "127.0.0.2:3260")

	for _, tc := range []struct {
		name, capture string
		recs          []volume.Record
		// exit scripts the exit code of each command; nil: all succeed.
		exit        func(argv []string) (code int, out string)
		unreachable []string
		noProbes    bool
		steps       []step
	}{
		{
			// The volume is mounted from sda: the stuck session's sdb is
			// nobody's last path in use, so it is logged out and in.
			name: "free capture, volume on the other session's disk: logout and login", capture: "iscsi-session-free",
			recs: []volume.Record{rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")},
			steps: []step{
				{after: 0, session: 2, reason: "down 0s"},
				{after: 30 * time.Second, session: 2, reason: "down 30s"},
				{after: 15 * time.Second, session: 2, verdict: heal.Kicked, kick: KickRelogin, reason: "LUN 0 (sdb) is used by no staged volume",
					argv: [][]string{logoutArgv(2), loginLost2}},
				{after: 5 * time.Second, snap: reloggedAs3, session: 3, verdict: heal.Repaired, kick: KickRelogin, reason: "LOGGED_IN 5s after logout-login",
					argv: [][]string{logoutArgv(2), loginLost2}},
				{after: 10 * time.Second, repeat: 10, snap: reloggedAs3, session: 3,
					argv: [][]string{logoutArgv(2), loginLost2}},
			},
		},
		{
			// The volume is mounted from sdb, the stuck session's only
			// disk: never logged out, iscsid restarted (devices kept).
			name: "free capture, volume on the stuck session's disk: restart only", capture: "iscsi-session-free",
			recs: []volume.Record{rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 15 * time.Second, session: 2, verdict: heal.Kicked, kick: KickRestart, reason: "LUN 0: sdb has no other live path and is used by volume pv",
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, repeat: 3, session: 2, kick: KickRestart, reason: "awaiting LOGGED_IN after restart-iscsid",
					argv: [][]string{restartArgv()}},
				{after: 5 * time.Second, snap: back, session: 2, verdict: heal.Repaired, kick: KickRestart, reason: "LOGGED_IN 35s after restart-iscsid",
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, repeat: 10, snap: back, session: 2,
					argv: [][]string{restartArgv()}},
			},
		},
		{
			// open-iscsi #387 beside a live path of one map, the volume on
			// the map: session2 alone is logged out, and its node record
			// (127.0.0.3, the proxy it logged in through) logged in.
			name: "stuck capture, volume on the map: logout session2, login 127.0.0.3", capture: "iscsi-session-stuck",
			recs: []volume.Record{rec("pv", stuckIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.3")},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 14 * time.Second, session: 2, reason: "down 44s"},
				{after: time.Second, session: 2, verdict: heal.Kicked, kick: KickRelogin, reason: "LUN 0 (dm-0) has another live path sda",
					argv: [][]string{logoutArgv(2), loginArgv(stuckIQN, "127.0.0.3:3260")}},
				{after: 5 * time.Second, snap: reloggedAs3, session: 3, verdict: heal.Repaired, kick: KickRelogin,
					argv: [][]string{logoutArgv(2), loginArgv(stuckIQN, "127.0.0.3:3260")}},
			},
		},
		{
			// iscsid retries an unreachable portal by itself: nothing runs,
			// however long it lasts.
			name: "portal unreachable: refused, nothing runs", capture: "iscsi-session-free",
			recs:        []volume.Record{rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")},
			unreachable: []string{"127.0.0.2:3260"},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 15 * time.Second, session: 2, verdict: heal.Refused, reason: "portal unreachable: "},
				{after: 10 * time.Second, repeat: 60, session: 2, verdict: heal.Refused, reason: "portal unreachable: "},
			},
		},
		{
			// iscsiadm refuses the logout with 32 (iscsid still
			// reconnecting): the session is still there, so no login; the
			// cooldown holds the next try for two minutes, no less.
			name: "logout exits 32: failed, no login, cooldown", capture: "iscsi-session-free",
			recs: []volume.Record{rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")},
			exit: func(argv []string) (int, string) {
				if iscsitest.Has(argv, "-m", "session", "-u") {
					return int(ExitSessionNotConnected), "iscsiadm: initiator reported error (32 - target likely not connected)"
				}
				return 0, ""
			},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 15 * time.Second, session: 2, verdict: heal.Failed, kick: KickRelogin, reason: "logout-login failed; chosen because LUN 0 (sdb)", errIs: ErrNotConnected,
					argv: [][]string{logoutArgv(2)}},
				{after: 10 * time.Second, session: 2, verdict: heal.Deferred, kick: KickRelogin, reason: "cooldown: kicked 10s ago, 1m50s left",
					argv: [][]string{logoutArgv(2)}},
				{after: 10 * time.Second, repeat: 10, session: 2, verdict: heal.Deferred, kick: KickRelogin, reason: "cooldown: kicked ",
					argv: [][]string{logoutArgv(2)}},
				{after: 10 * time.Second, session: 2, verdict: heal.Failed, kick: KickRelogin, errIs: ErrNotConnected,
					argv: [][]string{logoutArgv(2), logoutArgv(2)}},
			},
		},
		{
			// The target rejects the login (24): the session is gone (the
			// logout worked), and its portal is never logged in again by
			// the heal: credentials are not fixed by retrying. The node
			// record the heal logged out is reported at once as what it
			// is — refused for the rejection — not as a fresh absence
			// iscsid might still recover.
			name: "login exits 24: refused afterwards, nothing more runs", capture: "iscsi-session-free",
			recs: []volume.Record{rec("pv", lostIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")},
			exit: func(argv []string) (int, string) {
				if iscsitest.Has(argv, "--login") {
					return int(ExitLoginAuthFailed), "iscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)"
				}
				return 0, ""
			},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 15 * time.Second, session: 2, verdict: heal.Failed, kick: KickRelogin, reason: "logout-login failed", errIs: ErrAuthFailed,
					argv: [][]string{logoutArgv(2), loginLost2}},
				{after: 10 * time.Second, repeat: 65, snap: dropped, session: 0, verdict: heal.Refused, reason: "login rejected by the target: ",
					argv: [][]string{logoutArgv(2), loginLost2}},
			},
		},
		{
			// The restart did not bring the session back: the verify
			// window fails it after 2 min, and the next restart waits for
			// the 10 min budget, to the tick.
			name: "second restart within the restart cooldown: deferred", capture: "iscsi-session-free",
			recs: []volume.Record{rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")},
			steps: []step{
				{after: 0, session: 2},
				{after: 30 * time.Second, session: 2},
				{after: 15 * time.Second, session: 2, verdict: heal.Kicked, kick: KickRestart,
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, repeat: 11, session: 2, kick: KickRestart, reason: "awaiting LOGGED_IN after restart-iscsid",
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, session: 2, verdict: heal.Failed, kick: KickRestart, reason: "not LOGGED_IN 2m0s after restart-iscsid", errIs: errAny,
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, repeat: 47, session: 2, verdict: heal.Deferred, kick: KickRestart, reason: "restart cooldown: iscsid restarted ",
					argv: [][]string{restartArgv()}},
				{after: 10 * time.Second, session: 2, verdict: heal.Kicked, kick: KickRestart,
					argv: [][]string{restartArgv(), restartArgv()}},
			},
		},
		{
			// Both LUNs staged on a healthy node: nothing runs, nothing is
			// even probed.
			name: "healthy capture: 100 ticks, no command", capture: "iscsi-healthy",
			recs: []volume.Record{
				rec("pv-0", healthyIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2"),
				rec("pv-1", healthyIQN, 1, "/dev/dm-1", "127.0.0.1", "127.0.0.2"),
			},
			noProbes: true,
			steps:    []step{{after: 10 * time.Second, repeat: 100, session: 1}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := readCapture(t, tc.capture)
			ex := &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
				if tc.exit == nil {
					return iscsitest.Result{}
				}
				code, out := tc.exit(argv)
				return iscsitest.Result{Code: code, Out: out}
			}}
			in := newInitiator(t, ex, func(c *InitiatorConfig) { c.RestartCommand = []string{"systemctl", "restart", "iscsid"} })
			clk := clocktesting.NewFakeClock(t0)
			prober := &fakeProber{}
			for _, p := range tc.unreachable {
				prober.set(p, false)
			}
			h, err := NewSessionHealer(HealerConfig{Mode: heal.ModeRepair, Kicker: in, Prober: prober, Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			tick := 0
			for si, st := range tc.steps {
				for range max(st.repeat, 1) {
					tick++
					clk.Step(st.after)
					s := snap
					if st.snap != nil {
						s = st.snap(snap)
					}
					rs := checkClasses(t, tickHealer(context.Background(), h, nil, s, tc.recs, nil))
					rp := report(t, rs, st.session)
					where := func() string { return fmt.Sprintf("step %d, tick %d (%s)", si, tick, clk.Now().Sub(t0)) }
					if rp.Verdict != st.verdict || rp.Kick != st.kick || !strings.HasPrefix(rp.Reason, st.reason) {
						t.Fatalf("%s: %s: verdict %q kick %q reason %q; want %q %q %q…", where(), rp.Node, rp.Verdict, rp.Kick, rp.Reason, st.verdict, st.kick, st.reason)
					}
					switch {
					case st.errIs == nil && rp.Err != nil:
						t.Fatalf("%s: unexpected error %v", where(), rp.Err)
					case st.errIs == errAny && rp.Err == nil, st.errIs != nil && st.errIs != errAny && !errors.Is(rp.Err, st.errIs):
						t.Fatalf("%s: error %v, want %v", where(), rp.Err, st.errIs)
					}
					for _, o := range rs {
						if o.Session == rp.Session && o.State == rp.State {
							continue
						}
						if o.Verdict != "" || o.Kick != "" || !o.State.LoggedIn() {
							t.Fatalf("%s: another report is not quiet: %+v", where(), o)
						}
					}
					if diff := cmp.Diff(st.argv, ex.Calls(), cmpopts.EquateEmpty()); diff != "" {
						t.Fatalf("%s: commands (-want +got):\n%s", where(), diff)
					}
				}
			}
			if in.InFlight() != 0 {
				t.Errorf("%d commands still in flight", in.InFlight())
			}
			if prober.probes > 0 && tc.noProbes {
				t.Errorf("%d probes on a healthy node", prober.probes)
			}
		})
	}
}

// errAny stands for "some error" in a step's errIs.
var errAny = errors.New("any error")
