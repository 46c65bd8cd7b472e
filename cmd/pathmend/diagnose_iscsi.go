package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

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
	for _, f := range iscsi.Inspect(snap, recs) {
		d.defects = append(d.defects, f.Defect)
		d.plan = append(d.plan, iscsiPlanOf(snap, f, recs, cfg))
	}
	return d
}

// nodeKey is a session's node record, "<iqn> <portal> <iface>": the
// cooldown key of the session heal, which survives a relogin.
func nodeKey(s iscsi.Session) string { return s.Node().HealKey() }

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
			SizeBytes: l.SizeBytes, Holders: nonNil(l.Holders), Live: s.State.LoggedIn() && l.Running(), Volumes: iscsi.LUNVolumes(recs, s.TargetName, l.Address.LUN)}
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
		r.Volumes = iscsi.LUNVolumes(recs, r.Target, *r.LUN)
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
