package iscsi

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// The healthy capture: CHAP target, LUNs 0 and 1 behind two portals, one
// session per portal, one multipath map per LUN over both sessions' disks.
func TestRead_HealthyCaptureShowsTwoSessionsFourDisksAndTwoMaps(t *testing.T) {
	got := readCapture(t, "iscsi-healthy")
	const iqn = "iqn.2024-01.io.pathmend.lab:healthy"
	const lun0, lun1 = "naa.6001405576cc50fe2cb48818a080ab8f", "naa.60014058848e188d396406289a52c8bb"
	const mib64 = 64 << 20
	session := func(id, host int, addr, d0, d1, dm0, dm1 string) Session {
		h := HostID(host)
		return Session{
			ID: SessionID(id), Host: h, State: SessionLoggedIn, TargetName: iqn, TPGT: 1, RecoveryTmo: 5, TargetID: 0,
			IfaceName: "default", InitiatorName: "iqn.2004-10.com.example:pathmend-node-1",
			Connections: []Connection{{
				ID: ConnectionID{Session: SessionID(id)}, State: ConnUp,
				PersistentAddress: addr, PersistentPort: 3260, Address: addr, Port: 3260,
			}},
			LUNs: []LUN{
				{Address: SCSIAddress{Host: h, LUN: 0}, State: DeviceRunning, WWID: lun0, Disk: d0, SizeBytes: mib64, Holders: []string{dm0}},
				{Address: SCSIAddress{Host: h, LUN: 1}, State: DeviceRunning, WWID: lun1, Disk: d1, SizeBytes: mib64, Holders: []string{dm1}},
			},
		}
	}
	want := &Snapshot{
		At: t0,
		Sessions: []Session{
			session(1, 0, "127.0.0.1", "sda", "sdb", "dm-0", "dm-1"),
			session(2, 1, "127.0.0.2", "sdc", "sdd", "dm-0", "dm-1"),
		},
		Hosts: []Host{{ID: 0}, {ID: 1}},
		Maps: []MultipathMap{
			{Device: "dm-0", Name: "36001405576cc50fe2cb48818a080ab8f", UUID: "mpath-36001405576cc50fe2cb48818a080ab8f", Slaves: []string{"sda", "sdc"}, Holders: []string{}, SizeBytes: mib64},
			{Device: "dm-1", Name: "360014058848e188d396406289a52c8bb", UUID: "mpath-360014058848e188d396406289a52c8bb", Slaves: []string{"sdb", "sdd"}, Holders: []string{}, SizeBytes: mib64},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
	for _, d := range []string{"sda", "sdb", "sdc", "sdd"} {
		if !got.Live(d) {
			t.Errorf("%s is not a live path", d)
		}
	}
}

// A FAILED session: its connection failed (address and port answer
// ENOTCONN in the capture, so they are not read), its disk blocked.
func TestRead_FailedCaptureShowsTheBlockedPathAndNoCurrentAddress(t *testing.T) {
	got := readCapture(t, "iscsi-session-failed")
	if len(got.Sessions) != 2 || len(got.Maps) != 0 {
		t.Fatalf("want 2 sessions and no map, got %+v", got)
	}
	up, down := got.Sessions[0], got.Sessions[1]
	if up.State != SessionLoggedIn || up.Connections[0].Address != "127.0.0.1" {
		t.Errorf("session1 = %+v", up)
	}
	wantConn := Connection{ID: ConnectionID{Session: 2}, State: ConnFailed, PersistentAddress: "127.0.0.2", PersistentPort: 3260}
	if down.State != SessionFailed || down.RecoveryTmo != 600 {
		t.Errorf("session2 state %s recovery_tmo %d, want FAILED 600", down.State, down.RecoveryTmo)
	}
	if diff := cmp.Diff([]Connection{wantConn}, down.Connections); diff != "" {
		t.Errorf("session2 connection (-want +got):\n%s", diff)
	}
	if l, _ := down.LUN(0); l.State != DeviceBlocked || l.Disk != "sdb" || l.WWID != up.LUNs[0].WWID {
		t.Errorf("session2 LUN 0 = %+v", l)
	}
	if got.Live("sdb") || !got.Live("sda") {
		t.Error("sdb must not be live, sda must")
	}
	if p := down.PortalString(); p != "127.0.0.2:3260" {
		t.Errorf("portal %q", p)
	}
}

func TestRead_FreeCaptureShowsTheTransportOfflineDisk(t *testing.T) {
	got := readCapture(t, "iscsi-session-free")
	s, ok := got.Session(2)
	if !ok || s.State != SessionFree || s.Connections[0].State != ConnFailed {
		t.Fatalf("session2 = %+v", s)
	}
	if l, _ := s.LUN(0); l.State != DeviceTransportOffline {
		t.Errorf("LUN 0 state %s, want transport-offline", l.State)
	}
}

// The stuck capture (open-iscsi #387, iscsid logging "can't bind conn 2:0
// to session 2, retcode -107" with its portal passing again): in sysfs it
// is a FREE session like any other — connection failed, disk
// transport-offline — beside a live one, both disks slaves of one map.
func TestRead_StuckCaptureIsAFreeSessionBesideALivePathOfOneMap(t *testing.T) {
	got := readCapture(t, "iscsi-session-stuck")
	if len(got.Sessions) != 2 || len(got.Maps) != 1 {
		t.Fatalf("want 2 sessions and 1 map, got %+v", got)
	}
	up, stuck := got.Sessions[0], got.Sessions[1]
	if up.State != SessionLoggedIn || up.PortalString() != "127.0.0.1:3260" {
		t.Errorf("session1 = %+v", up)
	}
	if stuck.State != SessionFree || stuck.RecoveryTmo != 5 || stuck.PortalString() != "127.0.0.3:3260" {
		t.Errorf("session2 state %s recovery_tmo %d portal %s, want FREE 5 127.0.0.3:3260", stuck.State, stuck.RecoveryTmo, stuck.PortalString())
	}
	wantConn := Connection{ID: ConnectionID{Session: 2}, State: ConnFailed, PersistentAddress: "127.0.0.3", PersistentPort: 3260}
	if diff := cmp.Diff([]Connection{wantConn}, stuck.Connections); diff != "" {
		t.Errorf("session2 connection (-want +got):\n%s", diff)
	}
	l, _ := stuck.LUN(0)
	if l.State != DeviceTransportOffline || l.Disk != "sdb" || l.WWID != up.LUNs[0].WWID {
		t.Errorf("session2 LUN 0 = %+v", l)
	}
	m := got.Maps[0]
	if m.Device != "dm-0" || !strings.HasPrefix(m.UUID, "mpath-") || strings.Join(m.Slaves, ",") != "sda,sdb" {
		t.Errorf("map = %+v", m)
	}
	if got.Live("sdb") || !got.Live("sda") {
		t.Error("sdb must not be live, sda must")
	}
}

// Every required attribute, when missing, fails the read with its path.
func TestRead_MissingRequiredAttributeIsAnErrorNamingItsPath(t *testing.T) {
	sess := "devices/platform/host0/session1/iscsi_session/session1/"
	conn := "class/iscsi_connection/connection1:0/"
	lun := "devices/platform/host0/session1/target0:0:0/0:0:0:0/"
	for _, rel := range []string{
		sess + "state", sess + "targetname", sess + "tpgt", sess + "recovery_tmo",
		conn + "state", conn + "persistent_address", conn + "persistent_port", conn + "address", conn + "port",
		lun + "state", lun + "block/sda/size",
		"block/dm-0/dm/uuid", "block/dm-0/dm/name", "block/dm-0/size",
	} {
		t.Run(strings.ReplaceAll(rel, "/", "_"), func(t *testing.T) {
			fsys, dir := tree(t, twoPortals())
			if err := os.Remove(filepath.Join(dir, rel)); err != nil {
				// Paths through class links resolve to the device files.
				t.Fatal(err)
			}
			_, err := Read(fsys, t0)
			if err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(filepath.Base(rel), "/")) || !sysfs.IsNotExist(err) {
				t.Fatalf("Read = %v, want a not-exist error naming %s", err, rel)
			}
		})
	}
}

// A dm device whose dm/ directory is gone is being removed (the kernel
// removes dm/ before the block device) or has no table yet: it is no map
// of any disk and not an error, and it is read again on the next pass.
// (Seen in the lab: a map removed while the reader walked block/.)
func TestRead_ADMDeviceWithoutItsDMDirectoryIsSkipped(t *testing.T) {
	fsys, dir := tree(t, twoPortals())
	r := NewReader(fsys)
	if got, err := r.Read(t0); err != nil || len(got.Maps) != 1 {
		t.Fatalf("Read = %v, %v; want the one map", got, err)
	}
	dm := filepath.Join(dir, "block/dm-0/dm")
	saved := t.TempDir()
	if err := os.Rename(dm, filepath.Join(saved, "dm")); err != nil {
		t.Fatal(err)
	}
	got, err := r.Read(t0)
	if err != nil {
		t.Fatalf("Read without dm/ = %v, want no error", err)
	}
	if len(got.Maps) != 0 {
		t.Fatalf("maps without dm/ = %+v, want none", got.Maps)
	}
	if err := os.Rename(filepath.Join(saved, "dm"), dm); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Read(t0); err != nil || len(got.Maps) != 1 || got.Maps[0].Device != "dm-0" {
		t.Fatalf("Read with dm/ back = %v, %v; want dm-0", got, err)
	}
}

func TestRead_BadValuesAreErrors(t *testing.T) {
	for rel, val := range map[string]string{
		"class/iscsi_connection/connection1:0/persistent_port": "99999\n",
		"class/iscsi_session/session1/tpgt":                    "one\n",
		"class/iscsi_session/session1/target_id":               "-2\n",
	} {
		fsys, dir := tree(t, twoPortals())
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(val), 0o444); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(fsys, t0); err == nil || !strings.Contains(err.Error(), filepath.Base(rel)) {
			t.Errorf("%s = %q: Read = %v, want an error naming it", rel, val, err)
		}
	}
}

// Optional attributes: no wwid falls back to vpd_pg83 (the real page of a
// LIO LUN), no target_id is -1, a LUN without a disk has no Disk.
func TestRead_OptionalAttributesAndUnboundDisk(t *testing.T) {
	fx, err := sysfstest.LoadFixture(filepath.Join(fixtureDir, "iscsi-session-failed.sysfs"))
	if err != nil {
		t.Fatal(err)
	}
	page, ok := fx.Lookup("devices/platform/host0/session1/target0:0:0/0:0:0:0/vpd_pg83")
	if !ok {
		t.Fatal("capture has no vpd_pg83")
	}
	top := iscsitest.Topology{Sessions: []iscsitest.Session{{ID: 3, Host: 5, Target: "iqn.x:y", Address: "10.0.0.1",
		LUNs: []iscsitest.LUN{{LUN: 0, Disk: "sdq", VPD83: []byte(page.Value)}, {LUN: 7}}}}}
	fsys, dir := tree(t, top)
	if err := os.Remove(filepath.Join(dir, "class/iscsi_session/session3/target_id")); err != nil {
		t.Fatal(err)
	}
	snap, err := Read(fsys, t0)
	if err != nil {
		t.Fatal(err)
	}
	s := snap.Sessions[0]
	if s.TargetID != -1 {
		t.Errorf("TargetID %d, want -1", s.TargetID)
	}
	if s.LUNs[0].WWID != "naa.60014059d216f420d6d4d248eb84412a" {
		t.Errorf("WWID from vpd_pg83 = %q", s.LUNs[0].WWID)
	}
	if s.LUNs[1].Disk != "" || s.LUNs[1].WWID != "" || s.LUNs[1].Address.LUN != 7 {
		t.Errorf("unbound LUN = %+v", s.LUNs[1])
	}
}

// A vpd_pg83 page pathmend cannot derive an identifier from (truncated,
// or without a logical-unit designator) reads as no WWID, not as a failed
// read of the whole node.
func TestRead_UnusableVPDPageIsNoWWID(t *testing.T) {
	for name, page := range map[string][]byte{
		"truncated":     {0x00, 0x83, 0x00, 0x20, 0x01},
		"no designator": {0x00, 0x83, 0x00, 0x00},
		"not page 83":   {0x00, 0x80, 0x00, 0x00},
	} {
		t.Run(name, func(t *testing.T) {
			top := iscsitest.Topology{Sessions: []iscsitest.Session{{ID: 3, Host: 5, Target: "iqn.x:y", Address: "10.0.0.1",
				LUNs: []iscsitest.LUN{{LUN: 0, Disk: "sdq", VPD83: page}}}}}
			fsys, _ := tree(t, top)
			snap, err := Read(fsys, t0)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if l := snap.Sessions[0].LUNs[0]; l.WWID != "" || l.Disk != "sdq" {
				t.Errorf("LUN = %+v, want disk sdq without a WWID", l)
			}
		})
	}
}

// Device-mapper devices that are not multipath maps are not read as maps;
// a node without iSCSI modules reads as empty.
func TestRead_IgnoresOtherDMDevicesAndMissingClasses(t *testing.T) {
	top := twoPortals()
	top.Maps[0].UUID = "LVM-abc"
	fsys, _ := tree(t, top)
	snap, err := Read(fsys, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Maps) != 0 {
		t.Errorf("maps %+v, want none", snap.Maps)
	}
	empty, err := Read(sysfs.New(t.TempDir()), t0)
	if err != nil || len(empty.Sessions)+len(empty.Hosts)+len(empty.Maps) != 0 {
		t.Errorf("empty tree: %+v, %v", empty, err)
	}
}

// A session whose class link and directory are both gone was removed
// during the read; a dangling class link is a broken tree.
func TestRead_VanishedVersusBrokenSession(t *testing.T) {
	fsys, dir := tree(t, twoPortals())
	link := "class/iscsi_session/session2"
	notExist := &os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}
	if vanished(fsys, link, notExist) {
		t.Error("link still present: not vanished")
	}
	if err := os.RemoveAll(filepath.Join(dir, "devices/platform/host1/session2")); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(fsys, t0); err == nil {
		t.Error("dangling class link: want an error")
	}
	if err := os.Remove(filepath.Join(dir, link)); err != nil {
		t.Fatal(err)
	}
	if !vanished(fsys, link, notExist) {
		t.Error("link gone: vanished")
	}
	snap, err := Read(fsys, t0)
	if err != nil || len(snap.Sessions) != 1 {
		t.Errorf("after removal: %d sessions, %v", len(snap.Sessions), err)
	}
}

// TestRead_TargetIDMinusOneMidLogout: a session being logged out prints
// target_id -1; the read keeps the session with the id unknown.
func TestRead_TargetIDMinusOneMidLogout(t *testing.T) {
	dir := t.TempDir()
	if err := sysfstest.Materialize("../../testdata/fixtures/iscsi-healthy.sysfs", dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "devices/platform/host0/session1/iscsi_session/session1/target_id")
	if err := os.WriteFile(p, []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := Read(sysfs.New(dir), time.Now())
	if err != nil {
		t.Fatalf("Read with target_id -1: %v", err)
	}
	found := false
	for _, s := range snap.Sessions {
		if s.ID == 1 {
			found = true
			if s.TargetID != -1 {
				t.Errorf("TargetID = %d, want -1 (unknown)", s.TargetID)
			}
		}
	}
	if !found {
		t.Error("session1 dropped from the snapshot")
	}
}
