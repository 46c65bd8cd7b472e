package iscsi

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Class directories the read model starts from.
const (
	sessionClass    = "class/iscsi_session"
	connectionClass = "class/iscsi_connection"
	hostClass       = "class/iscsi_host"
)

// Read takes one snapshot of the iSCSI state below sys. at is stored as
// Snapshot.At. A session, connection or LUN that disappears while it is
// being read (a logout racing the read) is left out; any other missing
// required attribute is an error naming its path. Read never writes.
func Read(sys sysfs.FS, at time.Time) (*Snapshot, error) {
	snap := &Snapshot{At: at}
	names, err := optionalDir(sys, sessionClass)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "session") {
			continue
		}
		s, gone, err := readSession(sys, name)
		if err != nil {
			return nil, err
		}
		if !gone {
			snap.Sessions = append(snap.Sessions, s)
		}
	}
	sort.Slice(snap.Sessions, func(i, j int) bool { return snap.Sessions[i].ID < snap.Sessions[j].ID })

	// Connections are a class of their own; they name their session
	// (connection<sid>:<cid>), so they are read after the sessions.
	if err := readConnections(sys, snap); err != nil {
		return nil, err
	}
	if snap.Hosts, err = readHosts(sys); err != nil {
		return nil, err
	}
	if snap.Maps, err = readMaps(sys); err != nil {
		return nil, err
	}
	klog.V(5).InfoS("Read iSCSI snapshot", "sessions", len(snap.Sessions), "hosts", len(snap.Hosts), "maps", len(snap.Maps))
	return snap, nil
}

// optionalDir lists a class directory; a missing one (module not loaded)
// is empty, not an error.
func optionalDir(sys sysfs.FS, rel string) ([]string, error) {
	names, err := sys.ReadDir(rel)
	if sysfs.IsNotExist(err) {
		return nil, nil
	}
	return names, err
}

// readSession reads class/iscsi_session/<name> and the devices below the
// session. gone is set when the session vanished during the read.
func readSession(sys sysfs.FS, name string) (s Session, gone bool, err error) {
	id, err := ParseSessionID(name)
	if err != nil {
		return Session{}, false, err
	}
	link := sessionClass + "/" + name
	target, err := sys.ReadLink(link)
	if sysfs.IsNotExist(err) {
		return Session{}, true, nil
	}
	if err != nil {
		return Session{}, false, err
	}
	// The class link points at devices/platform/hostH/sessionN/iscsi_session/sessionN;
	// the session device, which holds the targets, is two levels up.
	dev := path.Join(sessionClass, target)
	sessDev := path.Dir(path.Dir(dev))
	host, err := ParseHostID(path.Base(path.Dir(sessDev)))
	if err != nil {
		return Session{}, false, fmt.Errorf("%s -> %s: %w", link, target, err)
	}
	s = Session{ID: id, Host: host}
	// A missing attribute below a session whose link is gone too means
	// the session was logged out while we read; anything else is a
	// broken tree and an error.
	if err := readSessionAttrs(sys, dev, &s); err != nil {
		if vanished(sys, link, err) {
			return Session{}, true, nil
		}
		return Session{}, false, err
	}
	if s.LUNs, err = readLUNs(sys, sessDev); err != nil {
		if vanished(sys, link, err) {
			return Session{}, true, nil
		}
		return Session{}, false, err
	}
	return s, false, nil
}

func readSessionAttrs(sys sysfs.FS, dev string, s *Session) error {
	state, err := sys.ReadAttr(dev + "/state")
	if err != nil {
		return err
	}
	s.State = SessionState(state)
	if s.TargetName, err = sys.ReadAttr(dev + "/targetname"); err != nil {
		return err
	}
	tpgt, err := sys.ReadIntAttr(dev + "/tpgt")
	if err != nil {
		return err
	}
	tmo, err := sys.ReadIntAttr(dev + "/recovery_tmo")
	if err != nil {
		return err
	}
	s.TPGT, s.RecoveryTmo = int(tpgt), int(tmo)
	// target_id, ifacename and initiatorname are published by every
	// current kernel but are not needed to judge a session: optional.
	s.TargetID = -1
	if v, ok, err := sys.ReadOptionalAttr(dev + "/target_id"); err != nil {
		return err
	} else if ok && v != "-1" {
		// The kernel prints -1 while a session has no target bound
		// (during a logout): not an error, the id is just unknown.
		if s.TargetID, err = parseNonNegative(v); err != nil {
			return fmt.Errorf("parse %s/target_id: %w", dev, err)
		}
	}
	if s.IfaceName, err = optionalName(sys, dev+"/ifacename"); err != nil {
		return err
	}
	s.InitiatorName, err = optionalName(sys, dev+"/initiatorname")
	return err
}

// optionalName reads a name attribute that a transport may not publish;
// the kernel prints an unset name as "(null)".
func optionalName(sys sysfs.FS, rel string) (string, error) {
	v, ok, err := sys.ReadOptionalAttr(rel)
	if err != nil || !ok || v == "(null)" {
		return "", err
	}
	return v, nil
}

// vanished reports whether err is a missing entry below an object whose
// class link is gone too: the object was removed during the read.
func vanished(sys sysfs.FS, link string, err error) bool {
	if !sysfs.IsNotExist(err) {
		return false
	}
	_, serr := sys.ReadLink(link)
	return sysfs.IsNotExist(serr)
}

// readConnections reads class/iscsi_connection/* and attaches each
// connection to its session.
func readConnections(sys sysfs.FS, snap *Snapshot) error {
	names, err := optionalDir(sys, connectionClass)
	if err != nil {
		return err
	}
	index := make(map[SessionID]int, len(snap.Sessions))
	for i, s := range snap.Sessions {
		index[s.ID] = i
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "connection") {
			continue
		}
		id, err := ParseConnectionID(name)
		if err != nil {
			return err
		}
		// A connection can outlive its session's listing by a moment
		// during a logout: skip it rather than invent a session.
		i, ok := index[id.Session]
		if !ok {
			continue // its session vanished during the read
		}
		c, err := readConnection(sys, id)
		if err != nil {
			if vanished(sys, connectionClass+"/"+name, err) {
				continue
			}
			return err
		}
		snap.Sessions[i].Connections = append(snap.Sessions[i].Connections, c)
	}
	for i := range snap.Sessions {
		cs := snap.Sessions[i].Connections
		sort.Slice(cs, func(a, b int) bool { return cs[a].ID.CID < cs[b].ID.CID })
	}
	return nil
}

func readConnection(sys sysfs.FS, id ConnectionID) (Connection, error) {
	dir := connectionClass + "/" + id.String()
	c := Connection{ID: id}
	state, err := sys.ReadAttr(dir + "/state")
	if err != nil {
		return Connection{}, err
	}
	c.State = ConnState(state)
	if c.PersistentAddress, err = sys.ReadAttr(dir + "/persistent_address"); err != nil {
		return Connection{}, err
	}
	port, err := sys.ReadAttr(dir + "/persistent_port")
	if err != nil {
		return Connection{}, err
	}
	if c.PersistentPort, err = parsePort(port); err != nil {
		return Connection{}, fmt.Errorf("parse %s/persistent_port: %w", dir, err)
	}
	if c.State != ConnUp {
		// address and port answer ENOTCONN while the connection is down.
		return c, nil
	}
	addr, ok, err := readConnected(sys, dir+"/address")
	if err != nil || !ok {
		return c, err
	}
	p, ok, err := readConnected(sys, dir+"/port")
	if err != nil || !ok {
		return c, err
	}
	if c.Port, err = parsePort(p); err != nil {
		return Connection{}, fmt.Errorf("parse %s/port: %w", dir, err)
	}
	c.Address = addr
	return c, nil
}

// readConnected reads an attribute that answers ENOTCONN while its
// connection is down (it may go down between reading state and this):
// ok is false then, and that is not an error.
func readConnected(sys sysfs.FS, rel string) (string, bool, error) {
	v, err := sys.ReadAttr(rel)
	if errors.Is(err, syscall.ENOTCONN) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return v, true, nil
}

// parsePort parses a TCP port as the kernel prints it.
func parsePort(s string) (int, error) {
	p, err := parseNonNegative(s)
	if err != nil || p > 65535 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return p, nil
}

// readHosts lists class/iscsi_host. Software iSCSI hosts publish nothing
// pathmend needs beyond their number (ipaddress answers ENOTCONN without
// a connection), so a Host is its ID.
func readHosts(sys sysfs.FS) ([]Host, error) {
	names, err := optionalDir(sys, hostClass)
	if err != nil {
		return nil, err
	}
	var hosts []Host
	for _, name := range names {
		if !strings.HasPrefix(name, "host") {
			continue
		}
		id, err := ParseHostID(name)
		if err != nil {
			return nil, err
		}
		hosts = append(hosts, Host{ID: id})
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].ID < hosts[j].ID })
	return hosts, nil
}
