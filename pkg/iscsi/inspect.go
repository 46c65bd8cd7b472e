package iscsi

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Defect kinds of the iSCSI diagnosis. SessionDown is also the kind the
// running plugin counts in its defects metric.
const (
	// KindSessionDown: a session is not LOGGED_IN (FAILED, FREE, or any
	// other state the kernel prints).
	KindSessionDown heal.Kind = "SessionDown"
	// KindLUNNotRunning: a LUN of a LOGGED_IN session is blocked, offline
	// or transport-offline.
	KindLUNNotRunning heal.Kind = "LUNNotRunning"
	// KindMapDegraded: a dm-multipath map over a target's LUN has fewer
	// live slaves than the target has sessions.
	KindMapDegraded heal.Kind = "MapDegraded"
)

// Finding is one defect of the iSCSI diagnosis and what it rests on.
type Finding struct {
	heal.Defect
	// Session is the session a SessionDown or LUNNotRunning defect is
	// about; 0 for MapDegraded.
	Session SessionID
	// Follows lists, for MapDegraded, the SessionDown and LUNNotRunning
	// defects its missing paths follow from ("SessionDown session5");
	// FollowsOnly is set when every missing path follows from one (the
	// map regains its path when they are healed).
	Follows     []string
	FollowsOnly bool
}

// Inspect diagnoses the iSCSI state of snap for the staged volumes recs
// (records of other transports are ignored). Only states the kernel
// positively shows are defects, so a healthy node yields none:
//
//   - SessionDown (scope controller, key: the session's node record) for
//     each session out of LOGGED_IN; its LUNs' states follow from it and
//     are in its detail, with what each LUN's device keeps or loses;
//   - LUNNotRunning (controller, key: node record and LUN) for each LUN
//     of a LOGGED_IN session the kernel blocked or offlined;
//   - MapDegraded (controller, key: the map's dm UUID) for a map over a
//     LUN of a known target with fewer live slaves than the target has
//     sessions; its detail says, per session, why it adds no live slave.
//
// Findings come by target, then sessions (by SID, then LUN), then maps.
// It reads only its arguments.
func Inspect(snap *Snapshot, recs []volume.Record) []Finding {
	recs = iscsiRecords(recs)
	var out []Finding
	targets := map[string]bool{}
	for _, s := range snap.Sessions {
		targets[s.TargetName] = true
	}
	for _, t := range slices.Sorted(maps.Keys(targets)) {
		for _, s := range snap.SessionsOf(t) {
			out = append(out, sessionFindings(snap, s, recs)...)
		}
		for _, m := range snap.Maps {
			if mt, lun, ok := MapTarget(snap, m); ok && mt == t {
				if f, ok := mapFinding(snap, m, t, lun, recs); ok {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// MapTarget returns the target and LUN of map m: those of its first
// slave that is an iSCSI disk. ok is false when no slave is.
func MapTarget(snap *Snapshot, m MultipathMap) (target string, lun int, ok bool) {
	for _, sl := range m.Slaves {
		if s, l, found := snap.PathOf(sl); found {
			return s.TargetName, l.Address.LUN, true
		}
	}
	return "", 0, false
}

// LUNVolumes are the IDs of the staged volumes in recs of target iqn,
// LUN lun, sorted; never nil.
func LUNVolumes(recs []volume.Record, iqn string, lun int) []string {
	ids := []string{}
	for _, r := range recs {
		if v := r.Context.ISCSI; v != nil && v.IQN == iqn && v.LUN == lun {
			ids = append(ids, r.VolumeID)
		}
	}
	slices.Sort(ids)
	return ids
}

// sessionFindings are the findings of one session: SessionDown for a
// session out of LOGGED_IN, else LUNNotRunning per LUN the kernel
// blocked or offlined.
func sessionFindings(snap *Snapshot, s Session, recs []volume.Record) []Finding {
	path := heal.Path{Name: s.ID.String(), Endpoint: s.PortalString(), State: string(s.State)}
	key := s.Node().HealKey()
	if !s.State.LoggedIn() {
		var vols, luns []string
		for _, l := range s.LUNs {
			vols = append(vols, LUNVolumes(recs, s.TargetName, l.Address.LUN)...)
			luns = append(luns, lunLoss(snap, s, l))
		}
		slices.Sort(vols)
		detail := fmt.Sprintf("%s to %s at %s is %s%s, recovery_tmo %ds", s.ID, s.TargetName, s.PortalString(), s.State, connStates(s), s.RecoveryTmo)
		if len(luns) == 0 {
			detail += "; no LUN"
		} else {
			detail += "; " + strings.Join(luns, "; ")
		}
		return []Finding{{Session: s.ID, Defect: heal.Defect{Kind: KindSessionDown, Scope: heal.ScopeController, Key: key,
			Subject:  fmt.Sprintf("%s %s %s %s", s.ID, s.TargetName, s.PortalString(), s.State),
			Teardown: []heal.Path{path}, Volumes: slices.Compact(vols), Detail: detail}}}
	}
	var out []Finding
	for _, l := range s.LUNs {
		switch l.State {
		case DeviceBlocked, DeviceOffline, DeviceTransportOffline:
		default:
			continue // running, or being added or removed
		}
		def := heal.Defect{Kind: KindLUNNotRunning, Scope: heal.ScopeController, Key: fmt.Sprintf("%s lun %d", key, l.Address.LUN),
			Subject:  fmt.Sprintf("%s %s LUN %d (%s) %s", s.ID, s.TargetName, l.Address.LUN, dash(l.Disk), l.State),
			Teardown: []heal.Path{}, Volumes: LUNVolumes(recs, s.TargetName, l.Address.LUN),
			Detail: fmt.Sprintf("%s is LOGGED_IN but its SCSI device %s is %s; %s", s.ID, l.Address, l.State, lunLoss(snap, s, l))}
		if len(def.Volumes) == 0 {
			def.Volumes = nil
		}
		out = append(out, Finding{Session: s.ID, Defect: def})
	}
	return out
}

// connStates renders ", connection connection2:0 failed" for each
// connection that is not up.
func connStates(s Session) string {
	var b strings.Builder
	for _, c := range s.Connections {
		if c.State != ConnUp {
			fmt.Fprintf(&b, ", connection %s %s", c.ID, c.State)
		}
	}
	return b.String()
}

// lunLoss says what LUN l of session s (a path that is not live) leaves:
// whether its device (its multipath map, or the disk itself) keeps
// another live path, or has just lost its last one.
func lunLoss(snap *Snapshot, s Session, l LUN) string {
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

// mapFinding is MapDegraded for map m over LUN lun of target when it has
// fewer live slaves than the target has sessions; the detail says, per
// session, why it contributes no live slave.
func mapFinding(snap *Snapshot, m MultipathMap, target string, lun int, recs []volume.Record) (Finding, bool) {
	live := 0
	for _, sl := range m.Slaves {
		if snap.Live(sl) {
			live++
		}
	}
	sessions := len(snap.SessionsOf(target))
	if live >= sessions {
		return Finding{}, false
	}
	var why, follows []string
	followsOnly := true // every missing path is a session or LUN defect of its own
	for _, s := range snap.SessionsOf(target) {
		l, ok := s.LUN(lun)
		switch {
		case !ok || l.Disk == "":
			why = append(why, fmt.Sprintf("%s has no disk for LUN %d", s.ID, lun))
			followsOnly = false
		case !slices.Contains(m.Slaves, l.Disk):
			why = append(why, fmt.Sprintf("%s on %s (%s, %s) is not a slave of %s", l.Disk, s.ID, s.State, l.State, m.Device))
			followsOnly = false
		case !s.State.LoggedIn():
			why = append(why, fmt.Sprintf("%s on %s is %s (session %s)", l.Disk, s.ID, l.State, s.State))
			follows = append(follows, string(KindSessionDown)+" "+s.ID.String())
		case !l.Running():
			why = append(why, fmt.Sprintf("%s on %s is %s", l.Disk, s.ID, l.State))
			if l.State == DeviceBlocked || l.State == DeviceOffline || l.State == DeviceTransportOffline {
				follows = append(follows, fmt.Sprintf("%s %s LUN %d", KindLUNNotRunning, s.ID, l.Address.LUN))
			} else {
				followsOnly = false
			}
		}
	}
	def := heal.Defect{Kind: KindMapDegraded, Scope: heal.ScopeController, Key: m.UUID,
		Subject:  fmt.Sprintf("%s (%s) %s LUN %d: %d of %d paths live", m.Device, m.Name, target, lun, live, sessions),
		Teardown: []heal.Path{}, Volumes: LUNVolumes(recs, target, lun),
		Detail: fmt.Sprintf("%s has %d live slave(s) for %d session(s) to %s: %s", m.Device, live, sessions, target,
			strings.Join(why, "; "))}
	if len(def.Volumes) == 0 {
		def.Volumes = nil
	}
	return Finding{Defect: def, Follows: follows, FollowsOnly: followsOnly}, true
}

// dash renders "" as "-".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
