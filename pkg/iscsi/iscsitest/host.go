package iscsitest

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

	"github.com/pathmend/pathmend/pkg/uevent"
)

// iscsiadm exit codes the fake host answers with (open-iscsi's
// include/iscsi_err.h; package iscsi types them, and this package imports
// only pkg/sysfs).
const (
	exitSessionExists = 15 // ISCSI_ERR_SESS_EXISTS
	exitNoObjects     = 21 // ISCSI_ERR_NO_OBJS_FOUND
)

// Host plays iscsid, the kernel and multipathd for code that drives
// open-iscsi: its Exec answers iscsiadm (node records, sendtargets
// discovery, login and logout by SID), multipath -f and multipathd;
// logins create sessions with their disks in the sysfs tree at Sys,
// logouts remove them; its multipathd assembles a map per LUN once two
// sessions carry it (or one, with MapSingle); Dev holds a file per disk
// and map; WriteAttr answers the sysfs writes of the attacher (a disk's
// device/delete removes the disk). Every command line is recorded in Exec.
//
// Set the knobs before the first command; a Host is then safe for
// concurrent use. Session names follow the portal, not the order of
// parallel logins: the first portal is session1 on host11 with sda (LUN 0)
// and sdb (LUN 1), the second session2 with sdc, sdd; a later login
// through the same portal adds 10 to the session.
type Host struct {
	// Sys and Dev are the sysfs tree and the device directory.
	Sys, Dev string
	// Exec answers the host commands.
	Exec *Exec
	// Target is the IQN sendtargets discovery reports.
	Target string
	// Portals are what sendtargets discovery reports, in order; they also
	// number the sessions.
	Portals []string
	// LoginCode maps a portal to the iscsiadm exit code of its logins.
	LoginCode map[string]int
	// FlushCode, when set, is the exit code of every multipath -f;
	// FlushBusy fails that many more flushes as a map still open for a
	// moment does (exit 1, "map in use").
	FlushCode, FlushBusy int
	// LUNs are the target's LUN numbers.
	LUNs []int
	// WWID names a LUN on a portal; Sectors sizes its disk (64 MiB when
	// nil or 0). MapSectors sizes the maps (64 MiB when 0).
	WWID       func(portal string, lun int) string
	Sectors    func(portal string, lun int) int64
	MapSectors int64
	// MapExtra lists disks multipathd wrongly adds to a LUN's map.
	MapExtra map[int][]string
	// NoDisk brings sessions up without their disks.
	NoDisk bool
	// Multipathd assembles maps; MapSingle maps single paths too
	// (find_multipaths no).
	Multipathd, MapSingle bool

	mu       sync.Mutex
	records  map[string]map[string]string // target,portal → settings
	sessions map[string]Session           // target,portal → session
	maps     map[int]Map                  // LUN → map
	logins   map[string]int               // portal → logins so far
	ann      announcer
}

// NewHost returns a host with an empty sysfs tree in sys, device files
// in dev (both created when missing), two portals (127.0.0.1:3260, 127.0.0.2:3260) of target
// iqn.2024-01.io.example:t with LUN 0, and multipathd running.
func NewHost(sys, dev string) (*Host, error) {
	h := &Host{
		Sys: sys, Dev: dev,
		Target:     "iqn.2024-01.io.example:t",
		Portals:    []string{"127.0.0.1:3260", "127.0.0.2:3260"},
		LoginCode:  map[string]int{},
		LUNs:       []int{0},
		WWID:       func(_ string, lun int) string { return fmt.Sprintf("naa.6001405%024d", lun) },
		MapExtra:   map[int][]string{},
		Multipathd: true,
		records:    map[string]map[string]string{},
		sessions:   map[string]Session{},
		maps:       map[int]Map{},
		logins:     map[string]int{},
	}
	for _, d := range []string{sys, dev} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := (Topology{}).Write(sys); err != nil {
		return nil, err
	}
	h.Exec = &Exec{Handler: h.handle}
	return h, nil
}

func arg(argv []string, flag string) string {
	if i := slices.Index(argv, flag); i >= 0 && i+1 < len(argv) {
		return argv[i+1]
	}
	return ""
}

func (h *Host) handle(_ context.Context, argv []string) Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch argv[0] {
	case "multipath":
		return h.flush(argv[2])
	case "multipathd":
		return Result{}
	}
	key := arg(argv, "-T") + "," + arg(argv, "-p")
	switch {
	case Has(argv, "-m", "discovery"):
		for _, p := range h.Portals {
			k := h.Target + "," + p
			if h.records[k] == nil {
				h.records[k] = map[string]string{}
			}
		}
	case Has(argv, "-m", "session", "-u"):
		return h.logout(arg(argv, "-r"))
	case Has(argv, "-o", "new"):
		h.records[key] = map[string]string{}
	case Has(argv, "-o", "update"):
		if h.records[key] == nil {
			return Result{Code: exitNoObjects}
		}
		h.records[key][arg(argv, "-n")] = arg(argv, "-v")
	case Has(argv, "-o", "delete"):
		delete(h.records, key)
	case Has(argv, "--login"):
		return h.login(key, arg(argv, "-T"), arg(argv, "-p"))
	default: // show
		if h.records[key] == nil {
			return Result{Code: exitNoObjects}
		}
	}
	return Result{}
}

func (h *Host) login(key, target, portal string) Result {
	if h.records[key] == nil {
		return Result{Code: exitNoObjects}
	}
	if _, ok := h.sessions[key]; ok {
		return Result{Code: exitSessionExists, Out: "iscsiadm: default: 1 session requested, but 1 already present."}
	}
	if c := h.LoginCode[portal]; c != 0 {
		return Result{Code: c}
	}
	addr, port, _ := strings.Cut(portal, ":")
	p, _ := strconv.Atoi(port)
	id := slices.Index(h.Portals, portal) + 1 + 10*h.logins[portal]
	h.logins[portal]++
	s := Session{ID: id, Host: id + 10, Target: target, Address: addr, Port: p, TPGT: 1, RecoveryTmo: 120}
	for i, n := range h.LUNs {
		l := LUN{LUN: n, WWID: h.WWID(portal, n)}
		if h.Sectors != nil {
			l.Sectors = h.Sectors(portal, n)
		}
		if !h.NoDisk {
			k := (id-1)*len(h.LUNs) + i
			l.Disk, l.Minor = "sd"+string(rune('a'+k%26)), k*16
			h.touch(l.Disk)
		}
		s.LUNs = append(s.LUNs, l)
	}
	if err := AddSession(h.Sys, s); err != nil {
		return Result{Code: 1, Out: err.Error()}
	}
	h.sessions[key] = s
	h.ann.sessionUp(s)
	if h.Multipathd {
		// multipathd adds a new path of a LUN to the LUN's map, and
		// assembles the maps not made yet.
		for _, l := range s.LUNs {
			if m, ok := h.maps[l.LUN]; ok && l.Disk != "" {
				h.addSlave(l.LUN, m, l.Disk)
			}
		}
		h.assemble()
	}
	return Result{}
}

// StartMultipathd starts multipathd late: it sets Multipathd and
// assembles the maps of the sessions already there at once, as a
// multipathd that was slow or stopped does after an attach settled for
// a single disk.
func (h *Host) StartMultipathd() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Multipathd = true
	h.assemble()
}

// assemble makes a map per LUN that two sessions carry (once).
func (h *Host) assemble() {
	for _, n := range h.LUNs {
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
		if len(slaves) < 2 && !(h.MapSingle && len(slaves) == 1) {
			continue
		}
		slaves = append(slaves, h.MapExtra[n]...)
		m := Map{Device: "dm-" + strconv.Itoa(n), Name: "mpath" + string(rune('a'+n)), Slaves: slaves, Sectors: h.MapSectors}
		if err := AddMap(h.Sys, m); err != nil {
			continue
		}
		h.touch(m.Device)
		h.maps[n] = m
		h.ann.mapEvent(uevent.Add, m)
		h.ann.mapEvent(uevent.Change, m)
		for _, sl := range slaves {
			// multipathd has udev look at a path it claims again.
			h.ann.diskChanged(h.sessions, sl)
		}
	}
}

func (h *Host) logout(sid string) Result {
	for k, s := range h.sessions {
		if strconv.Itoa(s.ID) == sid {
			if err := RemoveSession(h.Sys, s); err != nil {
				return Result{Code: 1, Out: err.Error()}
			}
			h.ann.sessionDown(s)
			for _, l := range s.LUNs {
				h.dropSlave(l.Disk)
			}
			delete(h.sessions, k)
			return Result{}
		}
	}
	return Result{Code: exitNoObjects}
}

// dropSlave takes a disk out of the map that holds it: multipathd
// removes a path whose device went away.
func (h *Host) dropSlave(disk string) {
	if disk == "" {
		return
	}
	for n, m := range h.maps {
		if i := slices.Index(m.Slaves, disk); i >= 0 {
			m.Slaves = slices.Delete(slices.Clone(m.Slaves), i, i+1)
			_ = os.Remove(filepath.Join(h.Sys, "devices/virtual/block", m.Device, "slaves", disk))
			h.maps[n] = m
			h.ann.mapEvent(uevent.Change, m)
		}
	}
}

func (h *Host) flush(name string) Result {
	if h.FlushCode != 0 {
		return Result{Code: h.FlushCode, Out: name + ": map in use"}
	}
	if h.FlushBusy > 0 {
		h.FlushBusy--
		return Result{Code: 1, Out: name + ": map in use"}
	}
	for n, m := range h.maps {
		if m.Name != name {
			continue
		}
		for _, p := range []string{"block/" + m.Device, "devices/virtual/block/" + m.Device} {
			_ = os.RemoveAll(filepath.Join(h.Sys, p))
		}
		for _, sl := range m.Slaves {
			_ = os.Remove(filepath.Join(h.Sys, "block", sl, "holders", m.Device))
		}
		_ = os.Remove(filepath.Join(h.Dev, m.Device))
		delete(h.maps, n)
		// dm announces its removal, then the block layer its disk's.
		h.ann.mapEvent(uevent.Remove, m)
		h.ann.mapEvent(uevent.Remove, m)
	}
	return Result{}
}

// WriteAttr writes a sysfs attribute as the kernel takes it: a disk's
// device/delete removes its SCSI device from the session; "C T L" to
// class/scsi_host/hostH/scan brings a LUN of the target back on the
// session of host H (multipathd adds its disk to the LUN's map); anything
// else is written to its file.
func (h *Host) WriteAttr(rel, value string) error {
	if disk, ok := strings.CutPrefix(rel, "block/"); ok {
		if disk, ok = strings.CutSuffix(disk, "/device/delete"); ok {
			return h.deleteDisk(disk)
		}
	}
	if host, ok := strings.CutPrefix(rel, "class/scsi_host/host"); ok {
		if host, ok = strings.CutSuffix(host, "/scan"); ok {
			if err := h.scan(host, value); err != nil {
				return err
			}
		}
	}
	p := filepath.Join(h.Sys, rel)
	if _, err := os.Stat(p); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(value), 0o200)
}

func (h *Host) deleteDisk(disk string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, s := range h.sessions {
		i := slices.IndexFunc(s.LUNs, func(l LUN) bool { return l.Disk == disk })
		if i < 0 {
			continue
		}
		// The kernel removes the whole SCSI device, not only its disk: the
		// LUN is gone from the session until a scan finds it again.
		ldir := fmt.Sprintf("%s/target%d:0:0/%d:0:0:%d", sessionDir(s), s.Host, s.Host, s.LUNs[i].LUN)
		for _, p := range []string{"block/" + disk, ldir} {
			if err := os.RemoveAll(filepath.Join(h.Sys, p)); err != nil {
				return err
			}
		}
		h.ann.diskChanged(h.sessions, disk)
		h.ann.lunDown(s, s.LUNs[i])
		s.LUNs = slices.Delete(slices.Clone(s.LUNs), i, i+1)
		h.sessions[k] = s
		h.dropSlave(disk)
		_ = os.Remove(filepath.Join(h.Dev, disk))
		return nil
	}
	return fmt.Errorf("write block/%s/device/delete: %w", disk, os.ErrNotExist)
}

// scan adds LUN "C T L" back to the session of SCSI host hostNum when the
// target has it and the session lacks it.
func (h *Host) scan(hostNum, args string) error {
	var c, t, lun int
	if _, err := fmt.Sscanf(args, "%d %d %d", &c, &t, &lun); err != nil {
		return fmt.Errorf("scan %q: %w", args, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, s := range h.sessions {
		if strconv.Itoa(s.Host) != hostNum || slices.ContainsFunc(s.LUNs, func(l LUN) bool { return l.LUN == lun }) {
			continue
		}
		i := slices.Index(h.LUNs, lun)
		if i < 0 {
			return nil // the target has no such LUN
		}
		portal := s.Address + ":" + strconv.Itoa(s.Port)
		l := LUN{LUN: lun, WWID: h.WWID(portal, lun)}
		if h.Sectors != nil {
			l.Sectors = h.Sectors(portal, lun)
		}
		if !h.NoDisk {
			n := (s.ID-1)*len(h.LUNs) + i
			l.Disk, l.Minor = "sd"+string(rune('a'+n%26)), n*16
			h.touch(l.Disk)
		}
		if err := AddLUN(h.Sys, s, l); err != nil {
			return err
		}
		s.LUNs = append(slices.Clone(s.LUNs), l)
		h.sessions[k] = s
		h.ann.lunUp(s, l)
		if m, ok := h.maps[lun]; ok && l.Disk != "" {
			h.addSlave(lun, m, l.Disk)
		} else if h.Multipathd {
			h.assemble()
		}
	}
	return nil
}

// addSlave puts disk back into the LUN's map, as multipathd does with a
// path that reappears.
func (h *Host) addSlave(lun int, m Map, disk string) {
	m.Slaves = append(slices.Clone(m.Slaves), disk)
	h.maps[lun] = m
	_ = os.Symlink("../../../../../block/"+disk, filepath.Join(h.Sys, "devices/virtual/block", m.Device, "slaves", disk))
	h.ann.mapEvent(uevent.Change, m)
	holders := filepath.Join(h.Sys, "block", disk, "holders")
	if err := os.MkdirAll(holders, 0o755); err == nil {
		_ = os.Symlink("../../../../../../../../virtual/block/"+m.Device, filepath.Join(holders, m.Device))
	}
}

func (h *Host) touch(name string) {
	_ = os.WriteFile(filepath.Join(h.Dev, name), nil, 0o600)
}

// RecordKeys lists the node records, "target,portal", sorted.
func (h *Host) RecordKeys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.records))
}

// RecordSettings returns the settings of a node record ("target,portal").
func (h *Host) RecordSettings(key string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.records[key])
}

// SessionKeys lists the node records with a session, sorted.
func (h *Host) SessionKeys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.sessions))
}

// SessionCount is the number of sessions.
func (h *Host) SessionCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// Session returns the session of a node record ("target,portal").
func (h *Host) Session(key string) (Session, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[key]
	return s, ok
}

// Maps lists the map devices, sorted.
func (h *Host) Maps() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, m := range h.maps {
		out = append(out, m.Device)
	}
	slices.Sort(out)
	return out
}

// SetSessionFailed makes the session of a node record ("target,portal")
// FAILED with its connection failed, as a lost connection leaves it while
// iscsid retries, or LOGGED_IN and up again. It reports whether there was
// such a session.
func (h *Host) SetSessionFailed(key string, failed bool) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[key]
	if !ok {
		return false, nil
	}
	s.State, s.ConnState = "LOGGED_IN", "up"
	if failed {
		s.State, s.ConnState = "FAILED", "failed"
	}
	if err := SetSessionState(h.Sys, s, s.State, s.ConnState); err != nil {
		return true, err
	}
	h.sessions[key] = s
	return true, nil
}
