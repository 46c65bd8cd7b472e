package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// iscsiPlanConfig is what --plan needs of the running plugin's session
// heal settings (the serve flags of the same names).
type iscsiPlanConfig struct {
	Scope     iscsi.HealScope
	Threshold time.Duration
	// Use reads whether a LUN's device is in use on the node (from
	// --mountinfo); nil without a mount table.
	Use iscsi.DeviceUse
}

// iscsiPlanOf is the dry-run verdict on one finding: a SessionDown gets the
// heal ladder's structural choice, a LUNNotRunning no repair (the heal
// kicks only sessions out of LOGGED_IN), a MapDegraded none of its own:
// it follows the session and LUN defects of its missing paths, or nothing
// pathmend repairs.
func iscsiPlanOf(snap *iscsi.Snapshot, f iscsi.Finding, recs []volume.Record, cfg iscsiPlanConfig) planRep {
	p := planRep{Kind: f.Kind, Scope: f.Scope, Key: f.Key}
	switch f.Kind {
	case iscsi.KindSessionDown:
		s, _ := snap.Session(f.Session)
		return planSessionDown(snap, s, recs, f.Defect, cfg)
	case iscsi.KindLUNNotRunning:
		p.Verdict, p.Reason = heal.Refused, "no automatic repair: the session heal kicks only sessions out of LOGGED_IN, and "+f.Session.String()+" is LOGGED_IN"
	case iscsi.KindMapDegraded:
		if f.FollowsOnly {
			p.Verdict, p.Reason = heal.Deferred, "no kick of its own: follows "+strings.Join(f.Follows, ", ")+"; the map regains the path when that is healed"
		} else {
			p.Verdict, p.Reason = heal.Refused, "no automatic repair: pathmend neither adds paths to a multipath map nor scans LUNs in; check multipathd and the target's LUN mapping"
		}
	}
	return p
}

// planSessionDown is the dry-run verdict on a SessionDown defect: the
// heal ladder's structural choice (iscsi.ChooseKick), never "would repair
// now". A one-shot diagnosis cannot know what gates the choice in the
// running plugin: how long the session has been down (the kernel keeps
// no timestamp; the plugin measures it) and whether the portal has been
// reachable all that time (diagnose probes nothing).
func planSessionDown(snap *iscsi.Snapshot, s iscsi.Session, recs []volume.Record, def heal.Defect, cfg iscsiPlanConfig) planRep {
	p := planRep{Kind: def.Kind, Scope: def.Scope, Key: def.Key}
	staged := false
	for _, r := range recs {
		staged = staged || r.Context.ISCSI.IQN == s.TargetName
	}
	if staged && cfg.Scope == iscsi.HealForeign {
		p.Verdict = heal.Refused
		p.Reason = fmt.Sprintf("owned by the node plugin: a staged volume uses target %s (heal scope %s)", s.TargetName, cfg.Scope)
		return p
	}
	if !cfg.Scope.InScope(boolInt(staged)) {
		p.Verdict = heal.Refused
		p.Reason = fmt.Sprintf("out of scope: no staged volume uses target %s (heal scope %s)", s.TargetName, cfg.Scope)
		return p
	}
	kick, why := iscsi.ChooseKick(snap, s, recs, cfg.Use)
	th := heal.RoundDuration(cfg.Threshold)
	p.Verdict = heal.Deferred
	p.Reason = fmt.Sprintf("would choose %s once down ≥ %s with the portal continuously reachable for %s, refused while it is unreachable; "+
		"diagnose does not probe the network, and time in state is measured by the running plugin; %s", kick, th, th, why)
	return p
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
