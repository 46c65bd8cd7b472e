package iscsi

import (
	"fmt"
	"strconv"
	"strings"
)

// SessionID is the kernel's session number: 4 for class/iscsi_session/session4.
// It is also what iscsiadm calls the SID (-m session -r 4). A session that is
// logged out and in again gets a new SessionID.
type SessionID int

// String is the sysfs name, "session4".
func (s SessionID) String() string { return "session" + strconv.Itoa(int(s)) }

// ParseSessionID parses "session4".
func ParseSessionID(name string) (SessionID, error) {
	n, err := parseSuffixedInt(name, "session")
	if err != nil {
		return 0, fmt.Errorf("session name %q: %w", name, err)
	}
	return SessionID(n), nil
}

// ConnectionID names one connection of a session: connection4:0 is
// connection 0 of session 4. open-iscsi uses one connection per session.
type ConnectionID struct {
	Session SessionID
	CID     int
}

// String is the sysfs name, "connection4:0".
func (c ConnectionID) String() string {
	return fmt.Sprintf("connection%d:%d", int(c.Session), c.CID)
}

// ParseConnectionID parses "connection4:0".
func ParseConnectionID(name string) (ConnectionID, error) {
	rest, ok := strings.CutPrefix(name, "connection")
	if !ok {
		return ConnectionID{}, fmt.Errorf("connection name %q: no \"connection\" prefix", name)
	}
	sid, cid, ok := strings.Cut(rest, ":")
	if !ok {
		return ConnectionID{}, fmt.Errorf("connection name %q: want connection<sid>:<cid>", name)
	}
	s, err := parseNonNegative(sid)
	if err != nil {
		return ConnectionID{}, fmt.Errorf("connection name %q: session: %w", name, err)
	}
	c, err := parseNonNegative(cid)
	if err != nil {
		return ConnectionID{}, fmt.Errorf("connection name %q: cid: %w", name, err)
	}
	return ConnectionID{Session: SessionID(s), CID: c}, nil
}

// HostID is a SCSI host number: 2 for host2. Every iscsi_tcp session gets
// its own host.
type HostID int

// String is the sysfs name, "host2".
func (h HostID) String() string { return "host" + strconv.Itoa(int(h)) }

// ParseHostID parses "host2".
func ParseHostID(name string) (HostID, error) {
	n, err := parseSuffixedInt(name, "host")
	if err != nil {
		return 0, fmt.Errorf("host name %q: %w", name, err)
	}
	return HostID(n), nil
}

// SCSIAddress is the host:channel:target:lun address of a SCSI device, the
// name of its directory below the session ("2:0:0:1").
type SCSIAddress struct {
	Host    HostID
	Channel int
	Target  int
	LUN     int
}

// String is the sysfs form, "2:0:0:1".
func (a SCSIAddress) String() string {
	return fmt.Sprintf("%d:%d:%d:%d", int(a.Host), a.Channel, a.Target, a.LUN)
}

// ScanArgs is what a scsi_host's scan attribute takes to scan exactly this
// device: "channel target lun".
func (a SCSIAddress) ScanArgs() string {
	return fmt.Sprintf("%d %d %d", a.Channel, a.Target, a.LUN)
}

// ParseSCSIAddress parses "2:0:0:1".
func ParseSCSIAddress(s string) (SCSIAddress, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return SCSIAddress{}, fmt.Errorf("SCSI address %q: want host:channel:target:lun", s)
	}
	var n [4]int
	for i, p := range parts {
		v, err := parseNonNegative(p)
		if err != nil {
			return SCSIAddress{}, fmt.Errorf("SCSI address %q: %w", s, err)
		}
		n[i] = v
	}
	return SCSIAddress{Host: HostID(n[0]), Channel: n[1], Target: n[2], LUN: n[3]}, nil
}

// parseTargetDir parses a target directory name below a session,
// "target2:0:0", into host, channel and target id.
func parseTargetDir(name string) (HostID, int, int, error) {
	rest, ok := strings.CutPrefix(name, "target")
	if !ok {
		return 0, 0, 0, fmt.Errorf("target name %q: no \"target\" prefix", name)
	}
	a, err := ParseSCSIAddress(rest + ":0")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("target name %q: %w", name, err)
	}
	return a.Host, a.Channel, a.Target, nil
}

func parseSuffixedInt(name, prefix string) (int, error) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, fmt.Errorf("no %q prefix", prefix)
	}
	return parseNonNegative(rest)
}

// parseNonNegative accepts plain decimal digits only: no sign, no spaces,
// no leading zeros (the kernel never prints them), at most 9 digits.
func parseNonNegative(s string) (int, error) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("bad number %q", s)
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("bad number %q", s)
		}
	}
	return strconv.Atoi(s)
}

// SessionState is class/iscsi_session/<s>/state as the kernel names it
// (iscsi_session_state_names in drivers/scsi/scsi_transport_iscsi.c).
type SessionState string

const (
	// SessionLoggedIn: the session is up and its devices unblocked.
	SessionLoggedIn SessionState = "LOGGED_IN"
	// SessionFailed: the connection failed; the devices are blocked while
	// iscsid reopens it, until recovery_tmo expires.
	SessionFailed SessionState = "FAILED"
	// SessionFree: recovery_tmo expired; the devices are transport-offline
	// (I/O fails fast) and iscsid keeps trying to reopen.
	SessionFree SessionState = "FREE"
)

// LoggedIn reports whether the session is LOGGED_IN.
func (s SessionState) LoggedIn() bool { return s == SessionLoggedIn }

// ConnState is class/iscsi_connection/<c>/state: up, down, failed or bound
// (connection_state_names in scsi_transport_iscsi.c; "bound" since 5.18).
type ConnState string

// Connection states.
const (
	ConnUp     ConnState = "up"
	ConnDown   ConnState = "down"
	ConnFailed ConnState = "failed"
	ConnBound  ConnState = "bound"
)

// DeviceState is the SCSI device state, devices/…/H:C:T:L/state
// (sdev_states in drivers/scsi/scsi_sysfs.c).
type DeviceState string

// SCSI device states pathmend branches on; the kernel has a few more
// (created, cancel, deleted, quiesce, created-blocked), kept as read.
const (
	DeviceRunning          DeviceState = "running"
	DeviceBlocked          DeviceState = "blocked"
	DeviceTransportOffline DeviceState = "transport-offline"
	DeviceOffline          DeviceState = "offline"
)
