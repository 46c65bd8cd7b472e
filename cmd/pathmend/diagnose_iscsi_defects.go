package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Defect kinds of the iSCSI part of `pathmend diagnose` (docs/diagnose.md).
// SessionDown is also the kind the running plugin counts in its defects
// metric.
const (
	// kindSessionDown: a session is not LOGGED_IN (FAILED, FREE, or any
	// other state the kernel prints).
	kindSessionDown heal.Kind = "SessionDown"
	// kindLUNNotRunning: a LUN of a LOGGED_IN session is blocked, offline
	// or transport-offline.
	kindLUNNotRunning heal.Kind = "LUNNotRunning"
	// kindMapDegraded: a dm-multipath map over a target's LUN has fewer
	// live slaves than the target has sessions.
	kindMapDegraded heal.Kind = "MapDegraded"
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

// sessionDefects adds the defects of one session: SessionDown for a
// session out of LOGGED_IN (its LUNs' states follow from it and are in
// its detail), else LUNNotRunning per LUN the kernel blocked or offlined.
func (d *iscsiDiagnosis) sessionDefects(snap *iscsi.Snapshot, s iscsi.Session, recs []volume.Record, cfg iscsiPlanConfig) {
	path := heal.Path{Name: s.ID.String(), Endpoint: s.PortalString(), State: string(s.State)}
	if !s.State.LoggedIn() {
		var vols []string
		var luns []string
		for _, l := range s.LUNs {
			vols = append(vols, lunVolumes(recs, s.TargetName, l.Address.LUN)...)
			luns = append(luns, lunLoss(snap, s, l))
		}
		slices.Sort(vols)
		detail := fmt.Sprintf("%s to %s at %s is %s%s, recovery_tmo %ds", s.ID, s.TargetName, s.PortalString(), s.State, connStates(s), s.RecoveryTmo)
		if len(luns) == 0 {
			detail += "; no LUN"
		} else {
			detail += "; " + strings.Join(luns, "; ")
		}
		def := heal.Defect{Kind: kindSessionDown, Scope: heal.ScopeController, Key: nodeKey(s),
			Subject:  fmt.Sprintf("%s %s %s %s", s.ID, s.TargetName, s.PortalString(), s.State),
			Teardown: []heal.Path{path}, Volumes: slices.Compact(vols), Detail: detail}
		d.defects = append(d.defects, def)
		d.plan = append(d.plan, planSessionDown(snap, s, recs, def, cfg))
		return
	}
	for _, l := range s.LUNs {
		switch l.State {
		case iscsi.DeviceBlocked, iscsi.DeviceOffline, iscsi.DeviceTransportOffline:
		default:
			continue // running, or being added or removed
		}
		def := heal.Defect{Kind: kindLUNNotRunning, Scope: heal.ScopeController, Key: fmt.Sprintf("%s lun %d", nodeKey(s), l.Address.LUN),
			Subject:  fmt.Sprintf("%s %s LUN %d (%s) %s", s.ID, s.TargetName, l.Address.LUN, dash(l.Disk), l.State),
			Teardown: []heal.Path{}, Volumes: lunVolumes(recs, s.TargetName, l.Address.LUN),
			Detail: fmt.Sprintf("%s is LOGGED_IN but its SCSI device %s is %s; %s", s.ID, l.Address, l.State, lunLoss(snap, s, l))}
		if len(def.Volumes) == 0 {
			def.Volumes = nil
		}
		d.defects = append(d.defects, def)
		d.plan = append(d.plan, planRep{Kind: def.Kind, Scope: def.Scope, Key: def.Key, Verdict: heal.Refused,
			Reason: "no automatic repair: the session heal kicks only sessions out of LOGGED_IN, and " + s.ID.String() + " is LOGGED_IN"})
	}
}

// connStates renders ", connection connection2:0 failed" for each
// connection that is not up.
func connStates(s iscsi.Session) string {
	var b strings.Builder
	for _, c := range s.Connections {
		if c.State != iscsi.ConnUp {
			fmt.Fprintf(&b, ", connection %s %s", c.ID, c.State)
		}
	}
	return b.String()
}

// lunLoss says what LUN l of session s (a path that is not live) leaves:
// whether its device (its multipath map, or the disk itself) keeps
// another live path, or has just lost its last one.
func lunLoss(snap *iscsi.Snapshot, s iscsi.Session, l iscsi.LUN) string {
	head := fmt.Sprintf("LUN %d: %s %s", l.Address.LUN, dash(l.Disk), l.State)
	if l.Disk == "" {
		return head + ", no disk"
	}
	if m, ok := snap.MapOf(l.Disk); ok {
		var live []string
		for _, sl := range m.Slaves {
			if sl != l.Disk && snap.Live(sl) {
				live = append(live, sl)
			}
		}
		if len(live) > 0 {
			return fmt.Sprintf("%s, %s keeps live path %s", head, m.Device, strings.Join(live, ","))
		}
		return fmt.Sprintf("%s, %s has no live path left (last path lost)", head, m.Device)
	}
	// Without a map the disk is a device of its own: other sessions'
	// disks of the same LUN are other devices, not paths of this one.
	var others []string
	for _, o := range snap.SessionsOf(s.TargetName) {
		if x, ok := o.LUN(l.Address.LUN); ok && o.ID != s.ID && x.Disk != "" && snap.Live(x.Disk) {
			others = append(others, x.Disk+" on "+o.ID.String())
		}
	}
	msg := fmt.Sprintf("%s, in no multipath map: last path of %s lost", head, l.Disk)
	if len(others) > 0 {
		msg += " (the LUN is also " + strings.Join(others, ", ") + ", a separate device)"
	}
	return msg
}

// mapDefect adds MapDegraded for a map of a known target that has fewer
// live slaves than the target has sessions; the detail says, per session,
// why it contributes no live slave.
func (d *iscsiDiagnosis) mapDefect(snap *iscsi.Snapshot, m iscsi.MultipathMap, mr iscsiMapRep) {
	if mr.Target == "" || mr.LiveSlaves >= mr.SessionsOfTarget {
		return
	}
	var why []string
	followsOnly := true // every missing path is a session or LUN defect of its own
	var follows []string
	for _, s := range snap.SessionsOf(mr.Target) {
		l, ok := s.LUN(*mr.LUN)
		switch {
		case !ok || l.Disk == "":
			why = append(why, fmt.Sprintf("%s has no disk for LUN %d", s.ID, *mr.LUN))
			followsOnly = false
		case !slices.Contains(m.Slaves, l.Disk):
			why = append(why, fmt.Sprintf("%s on %s (%s, %s) is not a slave of %s", l.Disk, s.ID, s.State, l.State, m.Device))
			followsOnly = false
		case !s.State.LoggedIn():
			why = append(why, fmt.Sprintf("%s on %s is %s (session %s)", l.Disk, s.ID, l.State, s.State))
			follows = append(follows, string(kindSessionDown)+" "+s.ID.String())
		case !l.Running():
			why = append(why, fmt.Sprintf("%s on %s is %s", l.Disk, s.ID, l.State))
			if l.State == iscsi.DeviceBlocked || l.State == iscsi.DeviceOffline || l.State == iscsi.DeviceTransportOffline {
				follows = append(follows, fmt.Sprintf("%s %s LUN %d", kindLUNNotRunning, s.ID, l.Address.LUN))
			} else {
				followsOnly = false
			}
		}
	}
	def := heal.Defect{Kind: kindMapDegraded, Scope: heal.ScopeController, Key: m.UUID,
		Subject:  fmt.Sprintf("%s (%s) %s LUN %d: %d of %d paths live", m.Device, m.Name, mr.Target, *mr.LUN, mr.LiveSlaves, mr.SessionsOfTarget),
		Teardown: []heal.Path{}, Volumes: mr.Volumes,
		Detail: fmt.Sprintf("%s has %d live slave(s) for %d session(s) to %s: %s", m.Device, mr.LiveSlaves, mr.SessionsOfTarget, mr.Target,
			strings.Join(why, "; "))}
	if len(def.Volumes) == 0 {
		def.Volumes = nil
	}
	d.defects = append(d.defects, def)
	p := planRep{Kind: def.Kind, Scope: def.Scope, Key: def.Key}
	if followsOnly {
		p.Verdict, p.Reason = heal.Deferred, "no kick of its own: follows "+strings.Join(follows, ", ")+"; the map regains the path when that is healed"
	} else {
		p.Verdict, p.Reason = heal.Refused, "no automatic repair: pathmend neither adds paths to a multipath map nor scans LUNs in; check multipathd and the target's LUN mapping"
	}
	d.plan = append(d.plan, p)
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
