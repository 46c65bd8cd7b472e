package iscsi

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// session reads class/iscsi_session/<name> and the devices below the
// session. gone is set when the session vanished during the read.
func (p *pass) session(name string) (s Session, gone bool, err error) {
	id, err := ParseSessionID(name)
	if err != nil {
		return Session{}, false, err
	}
	m := p.r.sessions[name]
	if m == nil {
		m = &sessionMemo{object: object{rel: sessionClass + "/" + name}}
		p.r.sessions[name] = m
	}
	d, same, err := p.open(&m.object)
	if err != nil {
		// A missing session whose class link is gone too was logged
		// out while we read; a dangling link is a broken tree.
		if vanished(p.sys, m.rel, err) {
			return Session{}, true, nil
		}
		return Session{}, false, err
	}
	defer d.Close()
	if !same {
		*m = sessionMemo{object: m.object}
	}
	s = Session{ID: id}
	// A missing attribute below a session whose link is gone too means
	// the session was logged out while we read; anything else is a
	// broken tree and an error.
	known := same && m.state != ""
	if err := p.sessionAttrs(d, m, &s); err != nil {
		if vanished(p.sys, m.rel, err) || (known && removed(err)) {
			// Or an attribute this Reader read on this very session
			// directory is gone while the class link still resolves:
			// iscsi_remove_session has the transport class remove the
			// session's attributes (transport_unregister_device) before
			// it deletes the device. A session's attributes never go
			// otherwise.
			return Session{}, true, nil
		}
		return Session{}, false, err
	}
	if s.LUNs, err = p.luns(m); err != nil {
		if vanished(p.sys, m.rel, err) {
			return Session{}, true, nil
		}
		return Session{}, false, err
	}
	return s, false, nil
}

// loginPending is what the kernel shows for a session's targetname before
// iscsid set it: a session whose first login is under way.
const loginPending = "(null)"

// sessionAttrs reads the session's attributes. The class link target and
// targetname, tpgt and ifacename are read once per session, once set:
// iscsid sets them at every login from the session's node record (found
// by exactly target, portal and iface when iscsid adopts a session after
// a restart) and refuses a login whose TPGT differs from the session's.
func (p *pass) sessionAttrs(d sysfs.Dir, m *sessionMemo, s *Session) error {
	if !m.static {
		target, err := p.sys.ReadLink(m.rel)
		if err != nil {
			return err
		}
		// The class link points at devices/platform/hostH/sessionN/iscsi_session/sessionN;
		// the session device, which holds the targets, is two levels up.
		sessDev := path.Dir(path.Dir(path.Join(sessionClass, target)))
		host, err := ParseHostID(path.Base(path.Dir(sessDev)))
		if err != nil {
			return fmt.Errorf("%s -> %s: %w", m.rel, target, err)
		}
		m.host, m.sessDev = host, sessDev
		if err := text(d, "targetname", &m.targetName); err != nil {
			return err
		}
		if m.tpgt, err = integer(d, "tpgt", &m.tpgtRaw); err != nil {
			return err
		}
		if err := optionalName(d, "ifacename", &m.ifaceName); err != nil {
			return err
		}
		// While a session's first login is under way the kernel shows
		// "(null)" for targetname (and for ifacename, 0 for tpgt): iscsid
		// sets them when the login is done. Until then they are read
		// again every pass.
		m.static = m.targetName != loginPending
	}
	s.Host, s.TargetName, s.TPGT, s.IfaceName = m.host, m.targetName, m.tpgt, m.ifaceName
	if err := text(d, "state", &m.state); err != nil {
		return err
	}
	s.State = SessionState(m.state)
	var err error
	if s.RecoveryTmo, err = integer(d, "recovery_tmo", &m.recoveryTmo); err != nil {
		return err
	}
	// target_id and initiatorname are published by every current kernel
	// but are not needed to judge a session: optional.
	s.TargetID = -1
	if b, ok, err := d.ReadOptionalAttr("target_id"); err != nil {
		return err
	} else if ok && string(b) != "-1" {
		// The kernel prints -1 while a session has no target bound
		// (during a logout): not an error, the id is just unknown.
		m.targetID = sysfs.Intern(b, m.targetID)
		if s.TargetID, err = parseNonNegative(m.targetID); err != nil {
			return fmt.Errorf("parse %s/target_id: %w", d.Rel(), err)
		}
	}
	if err := optionalName(d, "initiatorname", &m.initiatorName); err != nil {
		return err
	}
	s.InitiatorName = m.initiatorName
	return nil
}

// text reads a required attribute of d into *v, keeping *v's string when
// the text did not change.
func text(d sysfs.Dir, name string, v *string) error {
	b, err := d.ReadAttr(name)
	if err != nil {
		return err
	}
	*v = sysfs.Intern(b, *v)
	return nil
}

// integer reads a required decimal attribute of d; raw keeps its text.
func integer(d sysfs.Dir, name string, raw *string) (int, error) {
	if err := text(d, name, raw); err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(*raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s/%s: %w", d.Rel(), name, err)
	}
	return int(n), nil
}

// optionalName reads a name attribute that a transport may not publish;
// the kernel prints an unset name as "(null)".
func optionalName(d sysfs.Dir, name string, v *string) error {
	b, ok, err := d.ReadOptionalAttr(name)
	if err != nil {
		return err
	}
	if !ok || string(b) == "(null)" {
		*v = ""
		return nil
	}
	*v = sysfs.Intern(b, *v)
	return nil
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

// connections reads class/iscsi_connection/* and attaches each
// connection to its session.
func (p *pass) connections(snap *Snapshot) error {
	names, err := p.list(connectionClass)
	if err != nil {
		return err
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
		i, ok := slices.BinarySearchFunc(snap.Sessions, id.Session, func(s Session, id SessionID) int { return int(s.ID) - int(id) })
		if !ok {
			continue // its session vanished during the read
		}
		c, known, err := p.connection(name, id)
		if err != nil {
			// Left out, as a session is (see session): a connection
			// whose link is gone too, or one whose attributes this
			// Reader read on this very directory are gone while its
			// link still resolves (iscsi_destroy_conn removes them
			// before the device), or an attribute read answered ENODEV,
			// which kernfs answers only for a node already removed.
			// (Seen in the lab: a logout's first event read
			// connection<sid>:0/state as ENODEV and the target's read
			// failed.)
			if vanished(p.sys, connectionClass+"/"+name, err) || errors.Is(err, syscall.ENODEV) || (known && removed(err)) {
				continue
			}
			return err
		}
		snap.Sessions[i].Connections = append(snap.Sessions[i].Connections, c)
	}
	for i := range snap.Sessions {
		slices.SortFunc(snap.Sessions[i].Connections, func(a, b Connection) int { return a.ID.CID - b.ID.CID })
	}
	return nil
}

// connection reads class/iscsi_connection/<name>. persistent_address and
// persistent_port are the session's portal in its node record, set by
// iscsid at every login from that record: they are read once per
// connection.
func (p *pass) connection(name string, id ConnectionID) (c Connection, known bool, err error) {
	m := p.r.conns[name]
	if m == nil {
		m = &connMemo{object: object{rel: connectionClass + "/" + name}}
		p.r.conns[name] = m
	}
	d, same, err := p.open(&m.object)
	if err != nil {
		return Connection{}, false, err
	}
	defer d.Close()
	if !same {
		*m = connMemo{object: m.object}
	}
	known = m.state != ""
	c = Connection{ID: id}
	if err := text(d, "state", &m.state); err != nil {
		return Connection{}, known, err
	}
	c.State = ConnState(m.state)
	if !m.static {
		if err := text(d, "persistent_address", &m.persistentAddress); err != nil {
			return Connection{}, known, err
		}
		b, err := d.ReadAttr("persistent_port")
		if err != nil {
			return Connection{}, known, err
		}
		if m.persistentPort, err = parsePort(string(b)); err != nil {
			return Connection{}, known, fmt.Errorf("parse %s/persistent_port: %w", d.Rel(), err)
		}
		m.static = true
	}
	c.PersistentAddress, c.PersistentPort = m.persistentAddress, m.persistentPort
	if c.State != ConnUp {
		// address and port answer ENOTCONN while the connection is down.
		return c, known, nil
	}
	ok, err := readConnected(d, "address", &m.address)
	if err != nil || !ok {
		return c, known, err
	}
	ok, err = readConnected(d, "port", &m.port)
	if err != nil || !ok {
		return c, known, err
	}
	if c.Port, err = parsePort(m.port); err != nil {
		return Connection{}, known, fmt.Errorf("parse %s/port: %w", d.Rel(), err)
	}
	c.Address = m.address
	return c, known, nil
}

// readConnected reads an attribute that answers ENOTCONN while its
// connection is down (it may go down between reading state and this):
// ok is false then, and that is not an error.
func readConnected(d sysfs.Dir, name string, v *string) (bool, error) {
	err := text(d, name, v)
	if errors.Is(err, syscall.ENOTCONN) {
		return false, nil
	}
	return err == nil, err
}

// parsePort parses a TCP port as the kernel prints it.
func parsePort(s string) (int, error) {
	p, err := parseNonNegative(s)
	if err != nil || p > 65535 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return p, nil
}
