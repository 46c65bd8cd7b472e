package attach

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// clocks is a fixed SessionClocks.
type clocks map[iscsi.SessionID]time.Duration

func (c clocks) DownFor(id iscsi.SessionID) (time.Duration, bool) {
	d, ok := c[id]
	return d, ok
}

// captureAttacher is an Attacher reading a lab capture.
func captureAttacher(t *testing.T, name string, c SessionClocks) *Attacher {
	t.Helper()
	dir := t.TempDir()
	if err := sysfstest.Materialize(filepath.Join("../../../testdata/fixtures", name+".sysfs"), dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	h := newFakeHost(t)
	return h.attacher(func(cfg *AttacherConfig) { cfg.Sys = sysfs.New(dir); cfg.Clocks = c })
}

func vol(iqn string, lun int, portals ...string) volume.Record {
	v := &volume.ISCSI{IQN: iqn, LUN: lun}
	for _, p := range portals {
		v.Portals = append(v.Portals, volume.Endpoint{Host: p, Port: 3260})
	}
	return record("pv", volume.Context{Transport: volume.TransportISCSI, ISCSI: v}, "")
}

func TestHealth_OnTheLabCaptures(t *testing.T) {
	for _, tc := range []struct {
		capture string
		rec     volume.Record
		clocks  SessionClocks
		want    volume.Condition
	}{
		{"iscsi-healthy", vol("iqn.2024-01.io.pathmend.lab:healthy", 1, "127.0.0.1", "127.0.0.2"), nil,
			volume.Condition{Status: volume.Healthy, Message: "2 of 2 portals logged in",
				Devices: []volume.BlockDevice{{Name: "dm-1", Number: volume.DeviceNumber{Major: 254, Minor: 1}}, {Name: "sdb", Number: volume.DeviceNumber{Major: 8, Minor: 16}}, {Name: "sdd", Number: volume.DeviceNumber{Major: 8, Minor: 48}}}}},
		{"iscsi-session-failed", vol("iqn.2024-01.io.pathmend.lab:failing", 0, "127.0.0.1", "127.0.0.2"), clocks{2: 40 * time.Second},
			volume.Condition{Status: volume.Degraded, Reason: ReasonPathsBelowExpected, Message: "1 of 2 portals logged in; session2 (127.0.0.2:3260) FAILED for 40s",
				Devices: []volume.BlockDevice{{Name: "sda", Number: volume.DeviceNumber{Major: 8, Minor: 0}}, {Name: "sdb", Number: volume.DeviceNumber{Major: 8, Minor: 16}}}}},
		{"iscsi-session-free", vol("iqn.2024-01.io.pathmend.lab:lost", 0, "127.0.0.2"), nil,
			volume.Condition{Status: volume.Inaccessible, Reason: ReasonNoLivePath, Message: "0 of 1 portals logged in; session2 (127.0.0.2:3260) FREE",
				Devices: []volume.BlockDevice{{Name: "sdb", Number: volume.DeviceNumber{Major: 8, Minor: 16}}}}},
		{"iscsi-session-stuck", vol("iqn.2024-01.io.pathmend.lab:stuck", 0, "127.0.0.1", "127.0.0.3"), clocks{2: 95 * time.Second},
			volume.Condition{Status: volume.Degraded, Reason: ReasonPathsBelowExpected, Message: "1 of 2 portals logged in; session2 (127.0.0.3:3260) FREE for 1m35s",
				Devices: []volume.BlockDevice{{Name: "dm-0", Number: volume.DeviceNumber{Major: 254, Minor: 0}}, {Name: "sda", Number: volume.DeviceNumber{Major: 8, Minor: 0}}, {Name: "sdb", Number: volume.DeviceNumber{Major: 8, Minor: 16}}}}},
		{"iscsi-healthy", vol("iqn.2024-01.io.pathmend.lab:healthy", 0, "127.0.0.1", "127.0.0.3"), nil,
			volume.Condition{Status: volume.Degraded, Reason: ReasonPathsBelowExpected, Message: "1 of 2 portals logged in; no session to 127.0.0.3:3260",
				Devices: []volume.BlockDevice{{Name: "dm-0", Number: volume.DeviceNumber{Major: 254, Minor: 0}}, {Name: "sda", Number: volume.DeviceNumber{Major: 8, Minor: 0}}}}},
		{"iscsi-healthy", vol("iqn.2024-01.io.pathmend.lab:healthy", 5, "127.0.0.1"), nil,
			volume.Condition{Status: volume.Inaccessible, Reason: ReasonNoLivePath, Message: "0 of 1 portals logged in; session1 (127.0.0.1:3260) LOGGED_IN without LUN 5"}},
	} {
		t.Run(tc.capture+"/"+tc.want.Message, func(t *testing.T) {
			a := captureAttacher(t, tc.capture, tc.clocks)
			if diff := cmp.Diff(tc.want, a.Health(context.Background(), tc.rec)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A LOGGED_IN session whose disk is not running is not a live path.
func TestHealth_LoggedInButDeviceBlocked(t *testing.T) {
	a := captureAttacher(t, "iscsi-healthy", nil)
	if err := os.WriteFile(a.cfg.Sys.Path("devices/platform/host1/session2/target1:0:0/1:0:0:0/state"), []byte("blocked\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := a.Health(context.Background(), vol("iqn.2024-01.io.pathmend.lab:healthy", 0, "127.0.0.1", "127.0.0.2"))
	want := "1 of 2 portals logged in; session2 (127.0.0.2:3260) LUN 0 (sdc) blocked"
	if got.Status != volume.Degraded || got.Message != want {
		t.Errorf("%+v", got)
	}
	if c := a.Health(context.Background(), volume.Record{}); c.Status != volume.Inaccessible || c.Reason != ReasonUnreadable {
		t.Errorf("not an iSCSI volume: %+v", c)
	}
}

// The real device-node check: a block node whose number matches sysfs.
func TestCheckBlockNode(t *testing.T) {
	// glibc's makedev, for numbers beyond the 8-bit minor / 12-bit major.
	makedev := func(major, minor uint64) uint64 {
		return (major&0xfff)<<8 | (major&0xfffff000)<<32 | minor&0xff | (minor&0xffffff00)<<12
	}
	for _, mm := range [][2]uint64{{8, 16}, {259, 70000}, {4096, 1 << 19}} {
		if maj, min := devMajorMinor(makedev(mm[0], mm[1])); maj != mm[0] || min != mm[1] {
			t.Errorf("%d:%d split to %d:%d", mm[0], mm[1], maj, min)
		}
	}
	dir := t.TempDir()
	reg := filepath.Join(dir, "file")
	if err := os.WriteFile(reg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkBlockNode(reg, "8:0"); err == nil {
		t.Error("a regular file passed as a block device")
	}
	if err := checkBlockNode(filepath.Join(dir, "missing"), "8:0"); err == nil {
		t.Error("a missing node passed")
	}
	testneed.Root(t, "creating a block device node")
	node := filepath.Join(dir, "sdz")
	if err := syscall.Mknod(node, syscall.S_IFBLK|0o600, 8<<8|16); err != nil {
		testneed.Skip(t, "mknod: %v", err)
	}
	if err := checkBlockNode(node, "8:16"); err != nil {
		t.Errorf("matching node: %v", err)
	}
	if err := checkBlockNode(node, "8:0"); err == nil {
		t.Error("a node of another device passed")
	}
}
