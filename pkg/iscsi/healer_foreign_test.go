package iscsi

import (
	"strings"
	"testing"
	"time"

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
