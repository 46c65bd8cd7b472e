package main

import (
	"context"
	"fmt"
	"io"
	"maps"
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
}

// iscsiRep is the "iscsi" key of the report: what one iscsi.Read saw and
// the staged iSCSI volumes matched to it.
type iscsiRep struct {
	Sessions []iscsiSessionRep `json:"sessions"`
	Maps     []iscsiMapRep     `json:"maps"`
	Volumes  []iscsiVolumeRep  `json:"volumes"`
}

// iscsiSessionRep is one kernel session.
type iscsiSessionRep struct {
	Name        string             `json:"name"` // session5
	SID         int                `json:"sid"`
	Host        string             `json:"host"`
	State       iscsi.SessionState `json:"state"`
	Target      string             `json:"target"`
	TPGT        int                `json:"tpgt"`
	Portal      string             `json:"portal"` // persistent, "" without a connection
	Iface       string             `json:"iface"`
	RecoveryTmo int                `json:"recoveryTmo"`
	Node        string             `json:"node"` // "<iqn> <portal> <iface>", the defect key
	Connections []iscsiConnRep     `json:"connections"`
	LUNs        []iscsiLUNRep      `json:"luns"`
}

// iscsiConnRep is one connection of a session.
type iscsiConnRep struct {
	Name    string          `json:"name"`
	State   iscsi.ConnState `json:"state"`
	Portal  string          `json:"portal"`  // persistent_address:persistent_port
	Address string          `json:"address"` // address:port, "" unless up
}

// iscsiLUNRep is one SCSI device of a session and what stacks on it.
type iscsiLUNRep struct {
	LUN       int               `json:"lun"`
	Address   string            `json:"address"` // H:C:T:L
	State     iscsi.DeviceState `json:"state"`
	WWID      string            `json:"wwid"`
	Disk      string            `json:"disk"` // "" while no disk is bound
	SizeBytes int64             `json:"sizeBytes"`
	Holders   []string          `json:"holders"`
	Map       string            `json:"map"` // dm-N holding the disk, ""
	Live      bool              `json:"live"`
	Volumes   []string          `json:"volumes"`
}

// iscsiMapRep is one dm-multipath map.
type iscsiMapRep struct {
	Device           string         `json:"device"`
	Name             string         `json:"name"`
	UUID             string         `json:"uuid"`
	SizeBytes        int64          `json:"sizeBytes"`
	Holders          []string       `json:"holders"`
	Target           string         `json:"target"` // "" when no slave is an iSCSI disk
	LUN              *int           `json:"lun"`    // null then
	Slaves           []iscsiPathRep `json:"slaves"`
	LiveSlaves       int            `json:"liveSlaves"`
	SessionsOfTarget int            `json:"sessionsOfTarget"`
	Volumes          []string       `json:"volumes"`
}

// iscsiPathRep is one disk of a LUN: a map's slave or a volume's path.
type iscsiPathRep struct {
	Disk         string             `json:"disk"`
	Session      string             `json:"session"`      // "" when no session holds the disk
	SessionState iscsi.SessionState `json:"sessionState"` // "" then
	State        iscsi.DeviceState  `json:"state"`        // SCSI state, "" then
	Live         bool               `json:"live"`
}

// iscsiVolumeRep is one staged iSCSI volume and what serves it.
type iscsiVolumeRep struct {
	VolumeID string           `json:"volumeID"`
	Target   string           `json:"target"`
	LUN      int              `json:"lun"`
	Portals  []iscsiPortalRep `json:"portals"`
	Device   string           `json:"device"` // as recorded
	Map      string           `json:"map"`
	Paths    []iscsiPathRep   `json:"paths"`
}

// iscsiPortalRep is one portal of a staged volume and the sessions to it.
type iscsiPortalRep struct {
	Portal   string   `json:"portal"`
	Sessions []string `json:"sessions"`
}

// iscsiDiagnosis is the iSCSI part of one diagnose run: the report, the
// defects in report order, and a dry-run plan entry per defect.
type iscsiDiagnosis struct {
	rep     iscsiRep
	defects []heal.Defect
	plan    []planRep
}

// diagnoseISCSI reports snap and the staged iSCSI volumes among records,
// and finds the defects. Only states the kernel positively shows are
// defects: a healthy node yields none. It reads only its arguments.
func diagnoseISCSI(snap *iscsi.Snapshot, records []volume.Record, cfg iscsiPlanConfig) iscsiDiagnosis {
	var recs []volume.Record
	for _, r := range records {
		if r.Context.Transport == volume.TransportISCSI && r.Context.ISCSI != nil {
			recs = append(recs, r)
		}
	}
	d := iscsiDiagnosis{rep: iscsiRep{Sessions: []iscsiSessionRep{}, Maps: []iscsiMapRep{}, Volumes: []iscsiVolumeRep{}}}
	for _, s := range snap.Sessions {
		d.rep.Sessions = append(d.rep.Sessions, newSessionRep(snap, s, recs))
	}
	for _, m := range snap.Maps {
		d.rep.Maps = append(d.rep.Maps, newMapRep(snap, m, recs))
	}
	for _, r := range recs {
		d.rep.Volumes = append(d.rep.Volumes, newISCSIVolumeRep(snap, r))
	}
	slices.SortStableFunc(d.rep.Volumes, func(a, b iscsiVolumeRep) int { return strings.Compare(a.VolumeID, b.VolumeID) })

	// Defects by target, then sessions (by SID, then LUN), then maps.
	targets := map[string]bool{}
	for _, s := range snap.Sessions {
		targets[s.TargetName] = true
	}
	for _, t := range slices.Sorted(maps.Keys(targets)) {
		for _, s := range snap.SessionsOf(t) {
			d.sessionDefects(snap, s, recs, cfg)
		}
		for i, m := range snap.Maps {
			if d.rep.Maps[i].Target == t {
				d.mapDefect(snap, m, d.rep.Maps[i])
			}
		}
	}
	return d
}

// nodeKey is a session's node record, "<iqn> <portal> <iface>": the
// cooldown key of the session heal, which survives a relogin.
func nodeKey(s iscsi.Session) string {
	iface := s.IfaceName
	if iface == "" {
		iface = iscsi.DefaultIface
	}
	return s.TargetName + " " + s.PortalString() + " " + iface
}

func newSessionRep(snap *iscsi.Snapshot, s iscsi.Session, recs []volume.Record) iscsiSessionRep {
	r := iscsiSessionRep{
		Name: s.ID.String(), SID: int(s.ID), Host: s.Host.String(), State: s.State, Target: s.TargetName, TPGT: s.TPGT,
		Iface: s.IfaceName, RecoveryTmo: s.RecoveryTmo, Node: nodeKey(s), Connections: []iscsiConnRep{}, LUNs: []iscsiLUNRep{},
	}
	if _, _, ok := s.Portal(); ok {
		r.Portal = s.PortalString()
	}
	for _, c := range s.Connections {
		cr := iscsiConnRep{Name: c.ID.String(), State: c.State, Portal: joinPortal(c.PersistentAddress, c.PersistentPort)}
		if c.Address != "" {
			cr.Address = joinPortal(c.Address, c.Port)
		}
		r.Connections = append(r.Connections, cr)
	}
	for _, l := range s.LUNs {
		lr := iscsiLUNRep{LUN: l.Address.LUN, Address: l.Address.String(), State: l.State, WWID: l.WWID, Disk: l.Disk,
			SizeBytes: l.SizeBytes, Holders: nonNil(l.Holders), Live: s.State.LoggedIn() && l.Running(), Volumes: lunVolumes(recs, s.TargetName, l.Address.LUN)}
		if m, ok := mapOf(snap, l.Disk); ok {
			lr.Map = m.Device
		}
		r.LUNs = append(r.LUNs, lr)
	}
	return r
}

// joinPortal renders host:port (IPv6 in brackets), as sessions do.
func joinPortal(addr string, port int) string {
	return volume.Endpoint{Host: addr, Port: uint16(port)}.String()
}

// mapOf is snap.MapOf for a disk that may be "".
func mapOf(snap *iscsi.Snapshot, disk string) (iscsi.MultipathMap, bool) {
	if disk == "" {
		return iscsi.MultipathMap{}, false
	}
	return snap.MapOf(disk)
}

// lunVolumes are the staged volumes of target iqn, LUN lun, sorted.
func lunVolumes(recs []volume.Record, iqn string, lun int) []string {
	ids := []string{}
	for _, r := range recs {
		if r.Context.ISCSI.IQN == iqn && r.Context.ISCSI.LUN == lun {
			ids = append(ids, r.VolumeID)
		}
	}
	slices.Sort(ids)
	return ids
}

// pathRepOf describes disk as a path of its LUN.
func pathRepOf(snap *iscsi.Snapshot, disk string) iscsiPathRep {
	p := iscsiPathRep{Disk: disk}
	if s, l, ok := snap.PathOf(disk); ok {
		p.Session, p.SessionState, p.State = s.ID.String(), s.State, l.State
		p.Live = s.State.LoggedIn() && l.Running()
	}
	return p
}

func newMapRep(snap *iscsi.Snapshot, m iscsi.MultipathMap, recs []volume.Record) iscsiMapRep {
	r := iscsiMapRep{Device: m.Device, Name: m.Name, UUID: m.UUID, SizeBytes: m.SizeBytes, Holders: nonNil(m.Holders),
		Slaves: []iscsiPathRep{}, Volumes: []string{}}
	for _, sl := range m.Slaves {
		p := pathRepOf(snap, sl)
		if p.Live {
			r.LiveSlaves++
		}
		if s, l, ok := snap.PathOf(sl); ok && r.Target == "" {
			lun := l.Address.LUN
			r.Target, r.LUN = s.TargetName, &lun
		}
		r.Slaves = append(r.Slaves, p)
	}
	if r.Target != "" {
		r.SessionsOfTarget = len(snap.SessionsOf(r.Target))
		r.Volumes = lunVolumes(recs, r.Target, *r.LUN)
	}
	return r
}

// newISCSIVolumeRep matches one staged volume to the sessions of its
// portals and its LUN's disks on every session to its target. Portals
// that name a host match no session: diagnose resolves no name.
func newISCSIVolumeRep(snap *iscsi.Snapshot, r volume.Record) iscsiVolumeRep {
	v := r.Context.ISCSI
	vr := iscsiVolumeRep{VolumeID: r.VolumeID, Target: v.IQN, LUN: v.LUN, Device: r.Device, Portals: []iscsiPortalRep{}, Paths: []iscsiPathRep{}}
	m := iscsi.NewPortalMatcher(context.Background(), nil)
	for _, ep := range v.Portals {
		pr := iscsiPortalRep{Portal: ep.String(), Sessions: []string{}}
		for _, s := range snap.SessionsOf(v.IQN) {
			if m.Session(s, v.IQN, ep) {
				pr.Sessions = append(pr.Sessions, s.ID.String())
			}
		}
		vr.Portals = append(vr.Portals, pr)
	}
	for _, s := range snap.SessionsOf(v.IQN) {
		if l, ok := s.LUN(v.LUN); ok && l.Disk != "" {
			vr.Paths = append(vr.Paths, pathRepOf(snap, l.Disk))
			if mp, ok := snap.MapOf(l.Disk); ok && vr.Map == "" {
				vr.Map = mp.Device
			}
		}
	}
	return vr
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
	if !staged && cfg.Scope != iscsi.HealAll {
		p.Verdict = heal.Refused
		p.Reason = fmt.Sprintf("out of scope: no staged volume uses target %s (heal scope %s)", s.TargetName, cfg.Scope)
		return p
	}
	kick, why := iscsi.ChooseKick(snap, s, recs)
	th := heal.RoundDuration(cfg.Threshold)
	p.Verdict = heal.Deferred
	p.Reason = fmt.Sprintf("would choose %s once down ≥ %s with the portal continuously reachable for %s, refused while it is unreachable; "+
		"diagnose does not probe the network, and time in state is measured by the running plugin; %s", kick, th, th, why)
	return p
}

// writeTable prints the iSCSI part of the report: sessions, their LUNs,
// the multipath maps and the staged iSCSI volumes. It prints nothing on a
// node without iSCSI sessions, maps or staged iSCSI volumes.
func (r *iscsiRep) writeTable(w io.Writer) {
	if len(r.Sessions) > 0 {
		fmt.Fprintln(w, "iSCSI sessions")
		rows := [][]string{{"SESSION", "STATE", "TARGET", "TPGT", "PORTAL", "IFACE", "RECOVERY_TMO", "CONNECTIONS"}}
		luns := [][]string{{"SESSION", "LUN", "ADDRESS", "DISK", "STATE", "SIZE", "WWID", "MAP", "VOLUMES"}}
		for _, s := range r.Sessions {
			var conns []string
			for _, c := range s.Connections {
				conns = append(conns, c.Name+" "+string(c.State))
			}
			rows = append(rows, []string{s.Name, string(s.State), s.Target, fmt.Sprint(s.TPGT), dash(s.Portal), dash(s.Iface),
				fmt.Sprintf("%ds", s.RecoveryTmo), dash(strings.Join(conns, ", "))})
			for _, l := range s.LUNs {
				size := "-"
				if l.Disk != "" {
					size = sizeString(uint64(l.SizeBytes))
				}
				luns = append(luns, []string{s.Name, fmt.Sprint(l.LUN), l.Address, dash(l.Disk), string(l.State), size, dash(l.WWID),
					dash(l.Map), dash(strings.Join(l.Volumes, ", "))})
			}
		}
		writeRows(w, rows)
		if len(luns) > 1 {
			writeRows(w, luns)
		} else {
			fmt.Fprintln(w, "  (no LUN)")
		}
		fmt.Fprintln(w)
	}
	if len(r.Maps) > 0 {
		fmt.Fprintln(w, "dm-multipath maps")
		rows := [][]string{{"MAP", "NAME", "TARGET", "LUN", "SIZE", "SLAVES", "LIVE", "VOLUMES"}}
		for _, m := range r.Maps {
			lun := "-"
			if m.LUN != nil {
				lun = fmt.Sprint(*m.LUN)
			}
			rows = append(rows, []string{m.Device, m.Name, dash(m.Target), lun, sizeString(uint64(m.SizeBytes)), dash(pathsString(m.Slaves)),
				fmt.Sprintf("%d/%d", m.LiveSlaves, m.SessionsOfTarget), dash(strings.Join(m.Volumes, ", "))})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
	if len(r.Volumes) > 0 {
		rows := [][]string{{"VOLUME", "TARGET", "LUN", "DEVICE", "MAP", "PATHS"}}
		for _, v := range r.Volumes {
			rows = append(rows, []string{v.VolumeID, v.Target, fmt.Sprint(v.LUN), dash(v.Device), dash(v.Map), dash(pathsString(v.Paths))})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
}

// pathsString renders "sda session1 live, sdc session2 blocked".
func pathsString(ps []iscsiPathRep) string {
	var out []string
	for _, p := range ps {
		state := "live"
		if !p.Live {
			state = dash(string(p.State))
		}
		out = append(out, p.Disk+" "+dash(p.Session)+" "+state)
	}
	return strings.Join(out, ", ")
}
