package iscsi

import (
	"maps"
	"slices"
	"strings"
	"sync"
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
// being read (a logout racing the read) is left out, and so is one the
// kernel is deleting: a SCSI device whose attributes are going with its
// uevent attribute already gone (device_del's order), a session whose
// attributes a Reader read before are gone while its class link still
// resolves; a disk being deleted leaves its LUN without a disk. Any other
// missing required attribute is an error naming its path. Read never writes and
// remembers nothing: every attribute is read (pathmend diagnose, the
// attacher). A loop that reads the same node again and again keeps a
// Reader instead.
func Read(sys sysfs.FS, at time.Time) (*Snapshot, error) {
	return NewReader(sys).Read(at)
}

// Reader takes snapshots of one node's iSCSI state again and again, as
// the session heal does every tick, each equal to what Read would return
// at that moment. Every directory is listed and every attribute that can
// change while its object lives is read on every Read: session,
// connection and SCSI device state, recovery_tmo, target_id,
// initiatorname, the connection's current address and port, a LUN's WWID
// (a rescan re-reads its VPD pages), disk and map sizes, a map's name,
// slaves and holders. What iscsid fixes for a session's life is read once
// per object and kept under the sysfs.Identity of its directory: the
// session's class link target (its host and device), target name, TPGT
// and iface; a connection's persistent address and port; a map's dm
// UUID. A session re-created under a used name is read afresh.
// docs/performance.md holds the facts each choice rests on.
//
// A Reader is safe for concurrent use; Reads are serialized.
type Reader struct {
	mu       sync.Mutex
	attrs    *sysfs.AttrReader
	pass     uint64
	classes  map[string]*listing
	sessions map[string]*sessionMemo
	conns    map[string]*connMemo
	maps     map[string]*mapMemo
}

// NewReader returns a Reader of sys that remembers nothing yet. It reads
// nothing.
func NewReader(sys sysfs.FS) *Reader {
	return &Reader{
		attrs:    sysfs.NewAttrReader(sys),
		classes:  map[string]*listing{},
		sessions: map[string]*sessionMemo{},
		conns:    map[string]*connMemo{},
		maps:     map[string]*mapMemo{},
	}
}

// Counts returns the attribute reads, directory listings and stats the
// Reader has made so far.
func (r *Reader) Counts() sysfs.Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attrs.Counts()
}

// Read takes one more snapshot; see Reader and the package function Read,
// whose result and errors it matches.
func (r *Reader) Read(at time.Time) (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pass++
	p := &pass{r: r, sys: r.attrs.FS(), root: r.attrs.OpenRoot()}
	defer p.root.Close()
	snap, err := p.snapshot(at)
	if err != nil {
		return nil, err
	}
	r.prune()
	klog.V(5).InfoS("Read iSCSI snapshot", "sessions", len(snap.Sessions), "hosts", len(snap.Hosts), "maps", len(snap.Maps))
	return snap, nil
}

// pass carries one Read: the Reader's memory, the FS and its root held
// open for the pass.
type pass struct {
	r    *Reader
	sys  sysfs.FS
	root sysfs.Dir
}

func (p *pass) snapshot(at time.Time) (*Snapshot, error) {
	snap := &Snapshot{At: at}
	names, err := p.list(sessionClass)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "session") {
			continue
		}
		s, gone, err := p.session(name)
		if err != nil {
			return nil, err
		}
		if !gone {
			snap.Sessions = append(snap.Sessions, s)
		}
	}
	slices.SortFunc(snap.Sessions, func(a, b Session) int { return int(a.ID) - int(b.ID) })

	// Connections are a class of their own; they name their session
	// (connection<sid>:<cid>), so they are read after the sessions.
	if err := p.connections(snap); err != nil {
		return nil, err
	}
	if snap.Hosts, err = p.hosts(); err != nil {
		return nil, err
	}
	if snap.Maps, err = p.multipathMaps(); err != nil {
		return nil, err
	}
	return snap, nil
}

// listing is a directory's entries as last read.
type listing struct{ names []string }

// list lists a class directory; a missing one (module not loaded) is
// empty, not an error.
func (p *pass) list(rel string) ([]string, error) {
	l := p.r.classes[rel]
	if l == nil {
		l = &listing{}
		p.r.classes[rel] = l
	}
	names, err := p.listDir(p.root, rel, l.names)
	l.names = names
	return names, err
}

// listDir lists the directory name below d; prev is its last listing. A
// missing directory lists nothing.
func (p *pass) listDir(d sysfs.Dir, name string, prev []string) ([]string, error) {
	sub, err := d.OpenDir(name)
	if sysfs.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return sub.Names(prev)
}

// hosts lists class/iscsi_host. Software iSCSI hosts publish nothing
// pathmend needs beyond their number (ipaddress answers ENOTCONN without
// a connection), so a Host is its ID.
func (p *pass) hosts() ([]Host, error) {
	names, err := p.list(hostClass)
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
	slices.SortFunc(hosts, func(a, b Host) int { return int(a.ID) - int(b.ID) })
	return hosts, nil
}

// prune forgets the objects the last pass did not see.
func (r *Reader) prune() {
	maps.DeleteFunc(r.sessions, func(_ string, m *sessionMemo) bool { return m.seen != r.pass })
	maps.DeleteFunc(r.conns, func(_ string, m *connMemo) bool { return m.seen != r.pass })
	maps.DeleteFunc(r.maps, func(_ string, m *mapMemo) bool { return m.seen != r.pass })
}
