package iscsi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// The device directories of session1's LUN 0 and its disk in twoPortals.
const (
	lun1 = "devices/platform/host0/session1/target0:0:0/0:0:0:0"
	sda1 = lun1 + "/block/sda"
)

// remove deletes entries below dir, as the kernel does one by one, and
// keeps the mtime of their directory (kernfs does not touch a directory's
// times when children go; the test's filesystem does).
func remove(t *testing.T, dir string, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		p := filepath.Join(dir, rel)
		st, err := os.Stat(filepath.Dir(p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Dir(p), st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
}

// readers are the reads a LUN being deleted must not fail: a fresh Read,
// a long-lived Reader's Read (it read the LUN before) and its ReadTarget.
func readers(fsys sysfs.FS, r *Reader) map[string]func() (*Snapshot, error) {
	return map[string]func() (*Snapshot, error){
		"Read":       func() (*Snapshot, error) { return Read(fsys, t0) },
		"Reader":     func() (*Snapshot, error) { return r.Read(t0) },
		"ReadTarget": func() (*Snapshot, error) { return r.ReadTarget("iqn.2024-01.io.example:t", t0) },
	}
}

// A SCSI device the kernel is deleting (device_del: its uevent attribute
// first, then its attributes, the directory last) is read as going away —
// left out of its session — at every step, not as a failed read of the
// node. (Seen in the lab: a logout's read found a LUN's directory without
// its state file, and the target's read failed.) The other session's LUN
// is read as before.
func TestRead_ALUNBeingDeletedIsLeftOut(t *testing.T) {
	steps := []struct {
		name string
		gone []string
	}{
		// (Its uevent alone gone, its attributes still read: the LUN
		// reads as the kernel shows it.)
		{"state", []string{lun1 + "/uevent", lun1 + "/state"}},
		{"wwid", []string{lun1 + "/uevent", lun1 + "/wwid"}},
		{"state and wwid", []string{lun1 + "/uevent", lun1 + "/state", lun1 + "/wwid"}},
		{"directory", []string{lun1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			fsys, dir := tree(t, twoPortals())
			r := NewReader(fsys)
			if snap, err := r.Read(t0); err != nil || len(snap.Sessions[0].LUNs) != 1 {
				t.Fatalf("before: %v, %v", snap, err)
			}
			remove(t, dir, st.gone...)
			for name, read := range readers(fsys, r) {
				snap, err := read()
				if err != nil {
					t.Fatalf("%s: %v, want the LUN read as going away", name, err)
				}
				s1, ok1 := snap.Session(1)
				s2, ok2 := snap.Session(2)
				if !ok1 || !ok2 {
					t.Fatalf("%s: sessions %+v, want both", name, snap.Sessions)
				}
				if len(s1.LUNs) != 0 {
					t.Errorf("%s: session1 LUNs %+v, want none", name, s1.LUNs)
				}
				if len(s2.LUNs) != 1 || s2.LUNs[0].Disk != "sdb" || s2.LUNs[0].WWID != "naa.6001405aaaa" {
					t.Errorf("%s: session2 LUNs %+v, want sdb", name, s2.LUNs)
				}
			}
		})
	}
}

// A missing attribute of a SCSI device that still has its uevent is no
// deletion: the read fails naming the attribute. A wwid the kernel
// published and no longer does is such an attribute (not "no WWID").
func TestRead_AMissingAttributeOfALiveLUNIsAnError(t *testing.T) {
	for _, attr := range []string{"state", "wwid"} {
		t.Run(attr, func(t *testing.T) {
			fsys, dir := tree(t, twoPortals())
			r := NewReader(fsys)
			if _, err := r.Read(t0); err != nil {
				t.Fatal(err)
			}
			remove(t, dir, lun1+"/"+attr)
			_, err := r.Read(t0)
			if err == nil || !sysfs.IsNotExist(err) || !strings.Contains(err.Error(), "0:0:0:0/"+attr) {
				t.Fatalf("Read = %v, want a not-exist error naming %s", err, attr)
			}
		})
	}
}

// A disk the kernel is deleting (its uevent and size gone, the LUN's
// attributes still there: sd released the device) reads as a LUN without
// a disk; a disk that lost its size but has its uevent is an error.
func TestRead_ADiskBeingDeletedLeavesItsLUNWithoutADisk(t *testing.T) {
	fsys, dir := tree(t, twoPortals())
	r := NewReader(fsys)
	if _, err := r.Read(t0); err != nil {
		t.Fatal(err)
	}
	remove(t, dir, sda1+"/size")
	if _, err := r.Read(t0); err == nil || !strings.Contains(err.Error(), "sda/size") {
		t.Fatalf("size gone, uevent there: Read = %v, want an error naming sda/size", err)
	}
	remove(t, dir, sda1+"/uevent")
	for name, read := range readers(fsys, r) {
		snap, err := read()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s1, _ := snap.Session(1)
		if len(s1.LUNs) != 1 || s1.LUNs[0].Disk != "" || s1.LUNs[0].State != DeviceRunning || s1.LUNs[0].WWID != "naa.6001405aaaa" {
			t.Errorf("%s: session1 LUNs %+v, want LUN 0 without a disk", name, s1.LUNs)
		}
	}
}

// A session whose attributes vanish while its class link still resolves
// is being removed (iscsi_remove_session has the transport class remove
// its attributes before it deletes the device): a Reader that read those
// attributes on that very directory leaves the session out. A Reader that
// never read them cannot tell a removal from a broken tree: an error.
func TestRead_ASessionWhoseAttributesVanishedIsGoingAway(t *testing.T) {
	const sess = "devices/platform/host0/session1/iscsi_session/session1/"
	fsys, dir := tree(t, twoPortals())
	r := NewReader(fsys)
	if _, err := r.Read(t0); err != nil {
		t.Fatal(err)
	}
	remove(t, dir, sess+"state", sess+"recovery_tmo")
	for _, read := range []func() (*Snapshot, error){
		func() (*Snapshot, error) { return r.Read(t0) },
		func() (*Snapshot, error) { return r.ReadTarget("iqn.2024-01.io.example:t", t0) },
	} {
		snap, err := read()
		if err != nil {
			t.Fatalf("a session read before: %v, want it left out", err)
		}
		if len(snap.Sessions) != 1 || snap.Sessions[0].ID != 2 {
			t.Errorf("sessions %+v, want session2 only", snap.Sessions)
		}
	}
	if _, err := Read(fsys, t0); err == nil || !strings.Contains(err.Error(), "session1/state") {
		t.Errorf("a fresh Read = %v, want an error naming session1/state", err)
	}
}

// A connection whose attributes vanish while its class link still
// resolves is being destroyed (iscsi_destroy_conn removes them before the
// device; seen in the lab: a logout's first event read
// connection<sid>:0/state as gone and the target's read failed): a Reader
// that read them on that very directory leaves the connection out and
// keeps its session as read. A Reader that never read them cannot tell a
// removal from a broken tree: an error.
func TestRead_AConnectionWhoseAttributesVanishedIsGoingAway(t *testing.T) {
	const conn = "class/iscsi_connection/connection1:0/"
	fsys, dir := tree(t, twoPortals())
	r := NewReader(fsys)
	if _, err := r.Read(t0); err != nil {
		t.Fatal(err)
	}
	remove(t, dir, conn+"state")
	for name, read := range map[string]func() (*Snapshot, error){
		"Read":       func() (*Snapshot, error) { return r.Read(t0) },
		"ReadTarget": func() (*Snapshot, error) { return r.ReadTarget("iqn.2024-01.io.example:t", t0) },
	} {
		snap, err := read()
		if err != nil {
			t.Fatalf("%s: a connection read before: %v, want it left out", name, err)
		}
		if len(snap.Sessions) != 2 {
			t.Fatalf("%s: sessions %+v, want both", name, snap.Sessions)
		}
		for _, s := range snap.Sessions {
			switch {
			case s.ID == 1 && len(s.Connections) != 0:
				t.Errorf("%s: session1's connections %+v, want none (being destroyed)", name, s.Connections)
			case s.ID == 2 && len(s.Connections) != 1:
				t.Errorf("%s: session2's connections %+v, want its one", name, s.Connections)
			}
		}
	}
	if _, err := Read(fsys, t0); err == nil || !strings.Contains(err.Error(), "connection1:0/state") {
		t.Errorf("a fresh Read = %v, want an error naming connection1:0/state", err)
	}
}
