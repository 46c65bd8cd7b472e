// Package iscsitest writes iSCSI sysfs trees for tests, laid out exactly
// like the captures of a Linux 6.1 host in pathmend's lab: the class links
// of sessions, connections, hosts and SCSI hosts, the session device with
// its target, LUN and block directories, and dm-multipath maps below
// devices/virtual/block. It writes the attributes pathmend reads or writes
// (write-only ones as empty mode-0200 files) and leaves out the rest.
//
// It serves as a fake kernel too: a test's fake iscsiadm adds a session
// with AddSession when it "logs in" and removes it with RemoveSession, and
// a fake multipathd adds a map with AddMap, all in the directory an
// attacher's sysfs.FS is rooted at. The package imports only pkg/sysfs.
package iscsitest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Session is one iSCSI session with its connection and LUNs.
type Session struct {
	ID   int
	Host int
	// State is LOGGED_IN when empty.
	State  string
	Target string
	// Address and Port are the portal; Port 3260 when zero.
	Address string
	Port    int
	// ConnState is "up" for a LOGGED_IN session and "failed" otherwise
	// when empty.
	ConnState   string
	TPGT        int
	RecoveryTmo int
	// Iface is "default" when empty.
	Iface string
	LUNs  []LUN
}

// LUN is one SCSI device of a session.
type LUN struct {
	LUN int
	// Disk is the block device, e.g. "sda"; empty for a LUN the disk
	// driver has not bound.
	Disk string
	// State is "running" when empty.
	State string
	// WWID is written as the wwid attribute unless empty.
	WWID string
	// VPD83 is written raw as vpd_pg83 unless nil.
	VPD83 []byte
	// Sectors is the size in 512-byte sectors; 131072 (64 MiB) when zero.
	Sectors int64
	// Minor is the disk's minor number (major 8).
	Minor int
}

// Map is one dm-multipath map.
type Map struct {
	// Device is "dm-N".
	Device string
	// Name is dm/name; UUID is dm/uuid ("mpath-" + Name when empty).
	Name, UUID string
	Slaves     []string
	Holders    []string
	// Sectors is the size; 131072 when zero.
	Sectors int64
}

// Topology is a whole tree.
type Topology struct {
	Sessions []Session
	Maps     []Map
}

// Write materializes the topology below dir (which must exist).
func (t Topology) Write(dir string) error {
	b := &builder{}
	for _, c := range []string{"class/iscsi_session", "class/iscsi_connection", "class/iscsi_host", "class/scsi_host", "block"} {
		b.dir(c)
	}
	for _, s := range t.Sessions {
		b.session(s)
	}
	for _, m := range t.Maps {
		b.mapDev(m)
	}
	return b.write(dir)
}

// AddSession writes one more session into an existing tree.
func AddSession(dir string, s Session) error {
	b := &builder{}
	b.session(s)
	return b.write(dir)
}

// AddMap writes one more map into an existing tree and links each slave's
// holders entry to it.
func AddMap(dir string, m Map) error {
	b := &builder{}
	b.mapDev(m)
	if err := b.write(dir); err != nil {
		return err
	}
	for _, sl := range m.Slaves {
		holders := filepath.Join(dir, "block", sl, "holders")
		if err := os.MkdirAll(holders, 0o755); err != nil {
			return err
		}
		if err := os.Symlink("../../../../../../../../virtual/block/"+m.Device, filepath.Join(holders, m.Device)); err != nil {
			return err
		}
	}
	return nil
}

// AddLUN writes one more LUN (with its disk, when it has one) into a
// session of an existing tree, as a scan that found it does.
func AddLUN(dir string, s Session, l LUN) error {
	b := &builder{}
	b.lun(fmt.Sprintf("%s/target%d:0:0", sessionDir(s), s.Host), s.Host, l)
	return b.write(dir)
}

// RemoveSession deletes a session the way a logout does: its class
// links, its block links and its device directory.
func RemoveSession(dir string, s Session) error {
	for _, l := range s.LUNs {
		if l.Disk != "" {
			if err := os.Remove(filepath.Join(dir, "block", l.Disk)); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
	}
	for _, p := range []string{
		"class/iscsi_session/session" + strconv.Itoa(s.ID),
		fmt.Sprintf("class/iscsi_connection/connection%d:0", s.ID),
		sessionDir(s),
	} {
		if err := os.RemoveAll(filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	return nil
}

// SetSessionState rewrites the state of session id and of its connection.
func SetSessionState(dir string, s Session, state, connState string) error {
	base := filepath.Join(dir, sessionDir(s))
	if err := os.WriteFile(filepath.Join(base, "iscsi_session", "session"+strconv.Itoa(s.ID), "state"), []byte(state+"\n"), 0o444); err != nil {
		return err
	}
	conn := fmt.Sprintf("connection%d:0", s.ID)
	return os.WriteFile(filepath.Join(base, conn, "iscsi_connection", conn, "state"), []byte(connState+"\n"), 0o444)
}

func sessionDir(s Session) string {
	return fmt.Sprintf("devices/platform/host%d/session%d", s.Host, s.ID)
}

type builder struct{ entries []sysfs.Entry }

func (b *builder) dir(p string) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindDir, Path: p})
}

func (b *builder) file(p, value string) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindFile, Path: p, Mode: 0o444, Value: value + "\n"})
}

func (b *builder) raw(p string, value []byte) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindFile, Path: p, Mode: 0o444, Value: string(value)})
}

func (b *builder) wo(p string) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindWriteOnly, Path: p, Mode: 0o200})
}

func (b *builder) unreadable(p, errno string) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindUnreadable, Path: p, Mode: 0o444, Value: errno})
}

func (b *builder) link(p, target string) {
	b.entries = append(b.entries, sysfs.Entry{Kind: sysfs.KindLink, Path: p, Target: target})
}

// write materializes the entries, leaving what exists in place (class
// directories a tree already has).
func (b *builder) write(dir string) error {
	f := &sysfs.Fixture{}
	for _, e := range b.entries {
		if e.Kind == sysfs.KindDir {
			if _, err := os.Stat(filepath.Join(dir, e.Path)); err == nil {
				continue
			}
		}
		f.Entries = append(f.Entries, e)
	}
	f.Sort()
	return f.Materialize(dir, time.Now())
}

func (b *builder) session(s Session) {
	if s.State == "" {
		s.State = "LOGGED_IN"
	}
	if s.ConnState == "" {
		s.ConnState = map[bool]string{true: "up", false: "failed"}[s.State == "LOGGED_IN"]
	}
	if s.Port == 0 {
		s.Port = 3260
	}
	if s.Iface == "" {
		s.Iface = "default"
	}
	host := "host" + strconv.Itoa(s.Host)
	sid := "session" + strconv.Itoa(s.ID)
	dev := sessionDir(s)
	// The host: one per session with iscsi_tcp.
	b.link("class/iscsi_host/"+host, "../../devices/platform/"+host+"/iscsi_host/"+host)
	b.link("class/scsi_host/"+host, "../../devices/platform/"+host+"/scsi_host/"+host)
	b.dir("devices/platform/" + host + "/iscsi_host/" + host)
	b.dir("devices/platform/" + host + "/scsi_host/" + host)
	b.wo("devices/platform/" + host + "/scsi_host/" + host + "/scan")
	// The session.
	sdir := dev + "/iscsi_session/" + sid
	b.link("class/iscsi_session/"+sid, "../../"+sdir)
	b.dir(sdir)
	b.file(sdir+"/state", s.State)
	b.file(sdir+"/targetname", s.Target)
	b.file(sdir+"/tpgt", strconv.Itoa(s.TPGT))
	b.file(sdir+"/recovery_tmo", strconv.Itoa(s.RecoveryTmo))
	b.file(sdir+"/target_id", "0")
	b.file(sdir+"/ifacename", s.Iface)
	b.file(sdir+"/initiatorname", "iqn.2004-10.com.example:pathmend-node-1")
	b.file(sdir+"/password", "(null)")
	// Its connection.
	conn := fmt.Sprintf("connection%d:0", s.ID)
	cdir := dev + "/" + conn + "/iscsi_connection/" + conn
	b.link("class/iscsi_connection/"+conn, "../../"+cdir)
	b.dir(cdir)
	b.file(cdir+"/state", s.ConnState)
	b.file(cdir+"/persistent_address", s.Address)
	b.file(cdir+"/persistent_port", strconv.Itoa(s.Port))
	if s.ConnState == "up" {
		b.file(cdir+"/address", s.Address)
		b.file(cdir+"/port", strconv.Itoa(s.Port))
	} else {
		b.unreadable(cdir+"/address", "ENOTCONN")
		b.unreadable(cdir+"/port", "ENOTCONN")
	}
	// Its LUNs.
	tgt := fmt.Sprintf("target%d:0:0", s.Host)
	for _, l := range s.LUNs {
		b.lun(dev+"/"+tgt, s.Host, l)
	}
}

func (b *builder) lun(tdir string, host int, l LUN) {
	if l.State == "" {
		l.State = "running"
	}
	if l.Sectors == 0 {
		l.Sectors = 131072
	}
	addr := fmt.Sprintf("%d:0:0:%d", host, l.LUN)
	ldir := tdir + "/" + addr
	b.dir(ldir)
	b.file(ldir+"/state", l.State)
	b.wo(ldir + "/delete")
	b.wo(ldir + "/rescan")
	if l.WWID != "" {
		b.file(ldir+"/wwid", l.WWID)
	}
	if l.VPD83 != nil {
		b.raw(ldir+"/vpd_pg83", l.VPD83)
	}
	if l.Disk == "" {
		return
	}
	bdir := ldir + "/block/" + l.Disk
	b.link("block/"+l.Disk, "../"+bdir)
	b.dir(bdir + "/holders")
	b.file(bdir+"/size", strconv.FormatInt(l.Sectors, 10))
	b.file(bdir+"/dev", "8:"+strconv.Itoa(l.Minor))
	b.link(bdir+"/device", "../../../"+addr)
}

func (b *builder) mapDev(m Map) {
	if m.UUID == "" {
		m.UUID = "mpath-" + m.Name
	}
	if m.Sectors == 0 {
		m.Sectors = 131072
	}
	dir := "devices/virtual/block/" + m.Device
	b.link("block/"+m.Device, "../"+dir)
	b.file(dir+"/dm/name", m.Name)
	b.file(dir+"/dm/uuid", m.UUID)
	b.file(dir+"/size", strconv.FormatInt(m.Sectors, 10))
	n, _ := strconv.Atoi(m.Device[len("dm-"):])
	b.file(dir+"/dev", "254:"+strconv.Itoa(n))
	b.dir(dir + "/slaves")
	b.dir(dir + "/holders")
	for _, h := range m.Holders {
		b.link(dir+"/holders/"+h, "../../"+h)
	}
	for _, sl := range m.Slaves {
		b.link(dir+"/slaves/"+sl, "../../../../../block/"+sl)
	}
}
