package attach

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// fakeHost plays iscsid, the kernel and multipathd for the attacher: its
// iscsiadm creates and removes sessions (with their disks) in a sysfs
// tree, its multipathd assembles a map once two sessions carry a LUN, and
// its /dev holds a file per disk and map.
type fakeHost struct {
	t       *testing.T
	sys     string
	dev     string
	exec    *iscsitest.Exec
	in      *iscsi.Initiator
	portals []string // what sendtargets discovery reports

	mu         sync.Mutex
	records    map[string]map[string]string // target,portal → settings
	sessions   map[string]iscsitest.Session // target,portal → session
	maps       map[int]iscsitest.Map        // LUN → map
	logins     map[string]int               // portal → logins so far
	loginCode  map[string]int               // portal → iscsiadm exit code of a login
	flushCode  int
	luns       []int // the target's LUNs
	wwid       func(portal string, lun int) string
	sectors    func(portal string, lun int) int64 // disk size; 64 MiB when nil or 0
	mapSectors int64                              // map size; 64 MiB when 0
	mapExtra   map[int][]string                   // LUN → disks multipathd wrongly adds to its map
	noDisk     bool                               // sessions come up without their disks
	multipathd bool
	mapSingle  bool // multipathd maps single paths (find_multipaths no)
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	h := &fakeHost{
		t: t, sys: t.TempDir(), dev: t.TempDir(),
		records: map[string]map[string]string{}, sessions: map[string]iscsitest.Session{}, maps: map[int]iscsitest.Map{},
		loginCode: map[string]int{}, logins: map[string]int{}, luns: []int{0}, multipathd: true,
		portals: []string{"127.0.0.1:3260", "127.0.0.2:3260"},
		wwid:    func(_ string, lun int) string { return fmt.Sprintf("naa.6001405%024d", lun) },
	}
	if err := (iscsitest.Topology{}).Write(h.sys); err != nil {
		t.Fatal(err)
	}
	h.exec = &iscsitest.Exec{Handler: h.handle}
	in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: h.exec, Sys: sysfs.New(h.sys), LoginTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h.in = in
	return h
}

// attacher returns an Attacher on this host with short waits.
func (h *fakeHost) attacher(recs RecordLister, mod func(*AttacherConfig)) *Attacher {
	h.t.Helper()
	cfg := AttacherConfig{
		Sys: sysfs.New(h.sys), DevRoot: h.dev, Initiator: h.in, Records: recs,
		NodeLoginTimeout: time.Second, NodeLoginRetries: 2,
		DeviceTimeout: time.Second, MultipathWait: 100 * time.Millisecond, PollInterval: 5 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := NewAttacher(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	a.checkNode = func(path, devt string) error { // regular files stand in for device nodes
		_, err := os.Stat(path)
		return err
	}
	return a
}

func arg(argv []string, flag string) string {
	if i := slices.Index(argv, flag); i >= 0 && i+1 < len(argv) {
		return argv[i+1]
	}
	return ""
}

func (h *fakeHost) handle(_ context.Context, argv []string) iscsitest.Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch argv[0] {
	case "multipath":
		return h.flush(argv[2])
	case "multipathd":
		return iscsitest.Result{}
	}
	key := arg(argv, "-T") + "," + arg(argv, "-p")
	switch {
	case iscsitest.Has(argv, "-m", "discovery"):
		for _, p := range h.portals {
			k := "iqn.2024-01.io.example:t," + p
			if h.records[k] == nil {
				h.records[k] = map[string]string{}
			}
		}
	case iscsitest.Has(argv, "-m", "session", "-u"):
		return h.logout(arg(argv, "-r"))
	case iscsitest.Has(argv, "-o", "new"):
		h.records[key] = map[string]string{}
	case iscsitest.Has(argv, "-o", "update"):
		if h.records[key] == nil {
			return iscsitest.Result{Code: int(iscsi.ExitNoObjects)}
		}
		h.records[key][arg(argv, "-n")] = arg(argv, "-v")
	case iscsitest.Has(argv, "-o", "delete"):
		delete(h.records, key)
	case iscsitest.Has(argv, "--login"):
		return h.login(key, arg(argv, "-T"), arg(argv, "-p"))
	default: // show
		if h.records[key] == nil {
			return iscsitest.Result{Code: int(iscsi.ExitNoObjects)}
		}
	}
	return iscsitest.Result{}
}

func (h *fakeHost) login(key, target, portal string) iscsitest.Result {
	if h.records[key] == nil {
		return iscsitest.Result{Code: int(iscsi.ExitNoObjects)}
	}
	if _, ok := h.sessions[key]; ok {
		return iscsitest.Result{Code: int(iscsi.ExitSessionExists), Out: "iscsiadm: default: 1 session requested, but 1 already present."}
	}
	if c := h.loginCode[portal]; c != 0 {
		return iscsitest.Result{Code: c}
	}
	addr, port, _ := strings.Cut(portal, ":")
	p, _ := strconv.Atoi(port)
	// Parallel logins finish in any order: names follow the portal, not
	// the order, so tests can name them: 127.0.0.1 is session1 on host11
	// with sda (LUN 0) and sdb (LUN 1), 127.0.0.2 session2 with sdc, sdd;
	// a later login through the same portal adds 10 to the session.
	id := slices.Index(h.portals, portal) + 1 + 10*h.logins[portal]
	h.logins[portal]++
	s := iscsitest.Session{ID: id, Host: id + 10, Target: target, Address: addr, Port: p, TPGT: 1, RecoveryTmo: 120}
	for i, n := range h.luns {
		l := iscsitest.LUN{LUN: n, WWID: h.wwid(portal, n)}
		if h.sectors != nil {
			l.Sectors = h.sectors(portal, n)
		}
		if !h.noDisk {
			k := (id-1)*len(h.luns) + i
			l.Disk, l.Minor = "sd"+string(rune('a'+k)), k*16
			h.touch(l.Disk)
		}
		s.LUNs = append(s.LUNs, l)
	}
	if err := iscsitest.AddSession(h.sys, s); err != nil {
		h.t.Error(err)
	}
	h.sessions[key] = s
	if h.multipathd {
		h.assemble()
	}
	return iscsitest.Result{}
}

// assemble makes a map per LUN that two sessions carry (once).
func (h *fakeHost) assemble() {
	for _, n := range h.luns {
		if _, ok := h.maps[n]; ok {
			continue
		}
		var slaves []string
		for _, k := range slices.Sorted(maps.Keys(h.sessions)) {
			for _, l := range h.sessions[k].LUNs {
				if l.LUN == n && l.Disk != "" {
					slaves = append(slaves, l.Disk)
				}
			}
		}
		if len(slaves) < 2 && !(h.mapSingle && len(slaves) == 1) {
			continue
		}
		slaves = append(slaves, h.mapExtra[n]...)
		m := iscsitest.Map{Device: "dm-" + strconv.Itoa(n), Name: "mpath" + string(rune('a'+n)), Slaves: slaves, Sectors: h.mapSectors}
		if err := iscsitest.AddMap(h.sys, m); err != nil {
			h.t.Error(err)
		}
		h.touch(m.Device)
		h.maps[n] = m
	}
}

func (h *fakeHost) logout(sid string) iscsitest.Result {
	for k, s := range h.sessions {
		if strconv.Itoa(s.ID) == sid {
			if err := iscsitest.RemoveSession(h.sys, s); err != nil {
				h.t.Error(err)
			}
			delete(h.sessions, k)
			return iscsitest.Result{}
		}
	}
	return iscsitest.Result{Code: int(iscsi.ExitNoObjects)}
}

func (h *fakeHost) flush(name string) iscsitest.Result {
	if h.flushCode != 0 {
		return iscsitest.Result{Code: h.flushCode, Out: name + ": map in use"}
	}
	for n, m := range h.maps {
		if m.Name != name {
			continue
		}
		for _, p := range []string{"block/" + m.Device, "devices/virtual/block/" + m.Device} {
			_ = os.RemoveAll(filepath.Join(h.sys, p))
		}
		for _, sl := range m.Slaves {
			_ = os.Remove(filepath.Join(h.sys, "block", sl, "holders", m.Device))
		}
		delete(h.maps, n)
	}
	return iscsitest.Result{}
}

func (h *fakeHost) touch(name string) {
	if err := os.WriteFile(filepath.Join(h.dev, name), nil, 0o600); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) recordKeys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.records))
}

func (h *fakeHost) sessionCount() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.sessions) }

// records is a RecordLister over a settable list.
type records struct {
	mu   sync.Mutex
	list []volume.Record
}

func (r *records) List() ([]volume.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list), nil
}

func (r *records) set(recs ...volume.Record) { r.mu.Lock(); r.list = recs; r.mu.Unlock() }

const iqn = "iqn.2024-01.io.example:t"

func iscsiVolume(lun int, portals ...string) volume.Context {
	v := &volume.ISCSI{IQN: iqn, LUN: lun}
	for _, p := range portals {
		v.Portals = append(v.Portals, volume.Endpoint{Host: p, Port: 3260})
	}
	return volume.Context{Transport: volume.TransportISCSI, ISCSI: v}
}

func record(id string, c volume.Context, device string) volume.Record {
	return volume.Record{VolumeID: id, Context: c, Device: device, AccessType: volume.AccessMount}
}

// readWO reads back what was written to a write-only attribute.
func readWO(t *testing.T, root, rel string) string {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
