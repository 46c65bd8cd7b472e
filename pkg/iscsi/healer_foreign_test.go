package iscsi

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
)

// TestHeal_ForeignScopeKicksOnlyTargetsNoRecordNames: companion mode
// beside a node plugin. A session of a target a staged-volume record
// names is the plugin's (refused, owned_by_node_plugin); the same
// session of a target no record names is kicked, its last path by an
// iscsid restart, never a logout.
func TestHeal_ForeignScopeKicksOnlyTargetsNoRecordNames(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	down, _ := snap.Session(2)
	iqn := down.TargetName
	owned := newRig(t, func(c *HealerConfig) { c.Scope = HealForeign })
	pv := rec("pv", iqn, 0, "/dev/sda", "127.0.0.1")
	owned.tick(0, snap, pv)
	rp := report(t, owned.tick(time.Hour, snap, pv), down.ID)
	if rp.InScope || rp.Verdict != heal.Refused || rp.Class != heal.ClassOwnedByNodePlugin {
		t.Fatalf("a target the plugin staged: %+v", rp)
	}
	foreign := newRig(t, func(c *HealerConfig) { c.Scope = HealForeign })
	foreign.tick(0, snap)
	rp = report(t, foreign.tick(time.Minute, snap), down.ID)
	if !rp.InScope || rp.Kick != KickRestart {
		t.Fatalf("a foreign last path: %+v", rp)
	}
	if len(owned.kicker.Calls()) != 0 {
		t.Errorf("kicked the plugin's session: %v", owned.kicker.Calls())
	}
}

// TestHeal_DisabledKicksAreObservedNotRun: a kick kind that is not
// enabled is decided and reported (action_disabled) but never run.
func TestHeal_DisabledKicksAreObservedNotRun(t *testing.T) {
	snap := readCapture(t, "iscsi-session-free")
	r := newRig(t, func(c *HealerConfig) {
		c.Scope = HealForeign
		c.Disabled = map[Kick]string{KickRestart: "--iscsid-restart", KickRelogin: "--iscsi-relogin"}
	})
	down, _ := snap.Session(2)
	r.tick(0, snap)
	for range 3 {
		rp := report(t, r.tick(time.Minute, snap), down.ID)
		if rp.Verdict != heal.Observed || rp.Class != heal.ClassActionDisabled || !strings.Contains(rp.Reason, "not enabled (--iscsid-restart)") {
			t.Fatalf("disabled restart: %+v", rp)
		}
	}
	if len(r.kicker.Calls()) != 0 {
		t.Errorf("kicks: %v", r.kicker.Calls())
	}
}

// TestHeal_LogsEachChangeOfASessionsState: below the threshold the heal
// decides nothing and logs no verdict, so its log says when it first saw
// a session out of LOGGED_IN (its down clock starts then: at its first
// look after a restart of pathmend) and when the session was LOGGED_IN
// again, once per change, never once per tick. A companion started
// while a foreign session is down, that then sees iscsid bring it back
// by itself, says so instead of staying silent.
func TestHeal_LogsEachChangeOfASessionsState(t *testing.T) {
	down := readCapture(t, "iscsi-session-free")
	s, _ := down.Session(2)
	up := *down
	up.Sessions = slices.Clone(down.Sessions)
	for i := range up.Sessions {
		if up.Sessions[i].ID == s.ID {
			up.Sessions[i].State = SessionLoggedIn
		}
	}
	var lines []string
	ctx := klog.NewContext(context.Background(), funcr.New(func(prefix, args string) {
		lines = append(lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 2}))
	r := newRig(t, func(c *HealerConfig) { c.Scope = HealForeign; c.Threshold = 10 * time.Second })
	for _, step := range []*Snapshot{down, down, down, &up, &up, down} {
		r.clk.Step(time.Second)
		tickHealer(ctx, r.h, nil, step, nil, nil)
	}
	var changes []string
	for _, l := range lines {
		if strings.Contains(l, `"session"="`+s.ID.String()+`"`) {
			changes = append(changes, l)
		}
	}
	want := []string{"out of LOGGED_IN", "LOGGED_IN again", "out of LOGGED_IN"}
	if len(changes) != len(want) {
		t.Fatalf("lines about %s:\n%s\nwant %d: %v", s.ID, strings.Join(changes, "\n"), len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(changes[i], w) {
			t.Errorf("line %d = %s, want %q", i, changes[i], w)
		}
	}
	if !strings.Contains(changes[1], `"downFor"="3s"`) {
		t.Errorf("LOGGED_IN again: %s, want downFor 3s", changes[1])
	}
}
