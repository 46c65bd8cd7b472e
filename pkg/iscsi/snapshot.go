package iscsi

import (
	"net"
	"strconv"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Snapshot is every iSCSI session, connection and host, every LUN below a
// session and every dm-multipath map, as one Read saw them. It is a value:
// nothing mutates a Snapshot after Read returns it, so one snapshot can be
// shared by the attacher's health check and the session heal of one tick.
type Snapshot struct {
	// At is when the read started, from the reader's clock.
	At time.Time
	// Sessions are sorted by ID.
	Sessions []Session
	// Hosts are the iSCSI hosts, sorted by ID.
	Hosts []Host
	// Maps are the dm-multipath maps (dm/uuid starting with "mpath-"),
	// sorted by device name. Other device-mapper devices are not listed.
	Maps []MultipathMap
}

// Session is one iSCSI session. Field comments name the attribute below
// class/iscsi_session/<session>/ it comes from.
type Session struct {
	ID SessionID
	// Host is the SCSI host the session belongs to, from the device path
	// the class link points at (devices/platform/<host>/<session>).
	Host HostID
	// State: state.
	State SessionState
	// TargetName: targetname (the IQN).
	TargetName string
	// TPGT: tpgt, the target portal group tag.
	TPGT int
	// RecoveryTmo: recovery_tmo, seconds the devices stay blocked before
	// they go transport-offline (iscsid sets it from replacement_timeout,
	// multipathd lowers it to its fast_io_fail_tmo).
	RecoveryTmo int
	// TargetID: target_id, the SCSI target id of the session's target
	// (needed to scan a LUN that has no device yet); -1 when the kernel
	// does not publish it.
	TargetID int
	// IfaceName: ifacename, the open-iscsi iface ("default" for iscsi_tcp
	// without an iface binding); "" when not published.
	IfaceName string
	// InitiatorName: initiatorname; "" when not published.
	InitiatorName string
	// Connections are class/iscsi_connection/connection<sid>:<cid>,
	// sorted by CID. open-iscsi uses exactly one.
	Connections []Connection
	// LUNs are the SCSI devices below the session's target, sorted by LUN.
	LUNs []LUN
}

// Connection is one connection of a session, from
// class/iscsi_connection/<connection>/.
type Connection struct {
	ID ConnectionID
	// State: state (up, down, failed, bound).
	State ConnState
	// PersistentAddress and PersistentPort: persistent_address and
	// persistent_port, the portal the session was created for. They stay
	// readable while the connection is down.
	PersistentAddress string
	PersistentPort    int
	// Address and Port: address and port, the portal currently connected
	// to (differs from the persistent portal after a login redirect).
	// Read only while the connection is up: the kernel answers ENOTCONN
	// otherwise, which is expected and leaves them empty.
	Address string
	Port    int
}

// LUN is one SCSI device of a session, devices/…/<session>/target<H:C:T>/<H:C:T:L>.
type LUN struct {
	// Address is the directory name, H:C:T:L.
	Address SCSIAddress
	// State: state (running, blocked, transport-offline, …).
	State DeviceState
	// WWID: wwid, or derived from vpd_pg83 when wwid is absent; "" when
	// neither is published (the device cannot be verified then).
	WWID string
	// Disk is the block device below block/, e.g. "sda"; "" while the
	// disk driver has not bound yet.
	Disk string
	// SizeBytes: block/<disk>/size × 512; 0 without a disk.
	SizeBytes int64
	// Holders: block/<disk>/holders, e.g. ["dm-0"].
	Holders []string
}

// Running reports whether the device accepts I/O.
func (l LUN) Running() bool { return l.State == DeviceRunning }

// Host is one iSCSI host, class/iscsi_host/<host>. A software iSCSI
// (iscsi_tcp) host publishes nothing pathmend decides on beyond its
// number; it is listed so a report can show hosts left without sessions.
type Host struct {
	ID HostID
}

// MultipathMap is one dm-multipath map, block/dm-N.
type MultipathMap struct {
	// Device is the block device name, "dm-0".
	Device string
	// Name: dm/name, e.g. "mpatha" or the WWID.
	Name string
	// UUID: dm/uuid, "mpath-<wwid>".
	UUID string
	// Slaves: slaves/, the path devices, e.g. ["sda", "sdb"].
	Slaves []string
	// Holders: holders/, devices stacked on the map (LVM, partitions).
	Holders []string
	// SizeBytes: size × 512.
	SizeBytes int64
}

// Portal returns the session's portal, host and port, from its first
// connection's persistent address. ok is false for a session without a
// connection (being torn down).
func (s Session) Portal() (addr string, port int, ok bool) {
	if len(s.Connections) == 0 {
		return "", 0, false
	}
	c := s.Connections[0]
	return c.PersistentAddress, c.PersistentPort, true
}

// Node is the session's node record: its target, portal and iface.
func (s Session) Node() Node {
	n := Node{Target: s.TargetName, Iface: s.IfaceName}
	if addr, port, ok := s.Portal(); ok {
		n.Portal = volume.Endpoint{Host: addr, Port: uint16(port)}
	}
	return n
}

// PortalString renders the portal as host:port (IPv6 in brackets), or
// "no portal".
func (s Session) PortalString() string {
	addr, port, ok := s.Portal()
	if !ok {
		return "no portal"
	}
	return net.JoinHostPort(addr, strconv.Itoa(port))
}

// LUN returns the session's device with LUN number n.
func (s Session) LUN(n int) (LUN, bool) {
	for _, l := range s.LUNs {
		if l.Address.LUN == n {
			return l, true
		}
	}
	return LUN{}, false
}

// Session returns the session with the given ID.
func (s *Snapshot) Session(id SessionID) (Session, bool) {
	for _, x := range s.Sessions {
		if x.ID == id {
			return x, true
		}
	}
	return Session{}, false
}

// SessionsOf returns the sessions to target, in ID order.
func (s *Snapshot) SessionsOf(target string) []Session {
	var out []Session
	for _, x := range s.Sessions {
		if x.TargetName == target {
			out = append(out, x)
		}
	}
	return out
}

// MapOf returns the multipath map holding disk, if any.
func (s *Snapshot) MapOf(disk string) (MultipathMap, bool) {
	for _, m := range s.Maps {
		for _, sl := range m.Slaves {
			if sl == disk {
				return m, true
			}
		}
	}
	return MultipathMap{}, false
}

// PathOf returns the session and LUN that disk belongs to.
func (s *Snapshot) PathOf(disk string) (Session, LUN, bool) {
	for _, x := range s.Sessions {
		for _, l := range x.LUNs {
			if l.Disk == disk {
				return x, l, true
			}
		}
	}
	return Session{}, LUN{}, false
}

// Live reports whether disk is a usable path: its session LOGGED_IN and
// its SCSI device running.
func (s *Snapshot) Live(disk string) bool {
	x, l, ok := s.PathOf(disk)
	return ok && x.State.LoggedIn() && l.Running()
}
