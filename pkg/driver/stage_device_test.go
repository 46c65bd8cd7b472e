package driver_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// lateMapAttacher is the iSCSI attacher of a node whose multipathd builds
// its map only after Attach returned (slower than the attacher's
// multipath wait): Attach settles for one disk, the map then takes it.
type lateMapAttacher struct {
	*attach.Attacher
	host *iscsitest.Host
}

func (a lateMapAttacher) Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	att, err := a.Attacher.Attach(ctx, req)
	a.host.StartMultipathd()
	return att, err
}

// slowMultipathd makes the node's multipathd build no map within the
// attach's wait; the returned attacher starts it right after Attach.
func (n *node) slowMultipathd() lateMapAttacher {
	n.host.Multipathd = false
	return lateMapAttacher{Attacher: n.iscsiAtt, host: n.host}
}

// withISCSIAttacher rebuilds the driver with att as the iSCSI attacher.
func (n *node) withISCSIAttacher(att driver.Attacher) {
	n.t.Helper()
	ex := fsTools()
	d, err := driver.New(testConfig("ext4"), withTable(driver.Deps{
		SysFS: n.kernel.FS(), Intents: n.owner, Exec: ex,
		Mounter: &mount.SafeFormatAndMount{Interface: n.mnt, Exec: ex},
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: n.nvmeAtt,
			volume.TransportISCSI:   att,
		},
		Clock: n.clk,
	}, n.mnt.Table))
	if err != nil {
		n.t.Fatal(err)
	}
	n.drv = d
}

// stagedDevice returns the device and device number volumeID's record
// names and what is mounted at its staging path.
func (n *node) stagedDevice(volumeID string) (device, devNum string, mounted []string) {
	n.t.Helper()
	rec, err := n.store.Get(volumeID)
	if err != nil {
		n.t.Fatal(err)
	}
	mps, err := n.mnt.List()
	if err != nil {
		n.t.Fatal(err)
	}
	for _, mp := range mps {
		if mp.Path == n.stagingPath(volumeID) {
			mounted = append(mounted, mp.Device)
		}
	}
	return rec.Device, rec.DevNum.String(), mounted
}

// The kubelet lab's sequence: the attach found no map within its wait and
// settled for sda; multipathd then built the map over sda and sdc before
// the format. The stage formats and mounts the map, and records it.
func TestStage_ISCSIMapBuiltAfterTheAttachIsTheStagedDevice(t *testing.T) {
	for _, block := range []bool{false, true} {
		n := newNode(t)
		n.withISCSIAttacher(n.slowMultipathd())
		if err := n.stage("pv-0", iscsiVolumeContext(0), block); err != nil {
			t.Fatalf("block=%t: %v", block, err)
		}
		dev, devNum, mounted := n.stagedDevice("pv-0")
		dm := filepath.Join(n.host.Dev, "dm-0")
		want := []string{dm}
		if block {
			want = nil
		}
		if dev != dm || devNum != "254:0" || !cmp.Equal(mounted, want) {
			t.Errorf("block=%t: recorded %s (%s), mounted %v; want %s (254:0), mounted %v", block, dev, devNum, mounted, dm, want)
		}
	}
}

// The map took sda after its mkfs and before the mount, which fails
// busy: the stage mounts the map instead (same LUN, same filesystem)
// rather than undoing the attach.
func TestStage_ISCSIMapBuiltBeforeTheMountIsMounted(t *testing.T) {
	n := newNode(t)
	n.host.Multipathd = false
	sda := filepath.Join(n.host.Dev, "sda")
	var sources []string
	n.mnt.set(func(source, _ string) error {
		sources = append(sources, source)
		if source == sda {
			n.host.StartMultipathd()
			return errors.New("mount: " + source + ": already mounted or mount point busy")
		}
		return nil
	})
	if err := n.stage("pv-0", iscsiVolumeContext(0), false); err != nil {
		t.Fatal(err)
	}
	dm := filepath.Join(n.host.Dev, "dm-0")
	if diff := cmp.Diff([]string{sda, dm}, sources); diff != "" {
		t.Errorf("mounts tried (-want +got):\n%s", diff)
	}
	dev, devNum, mounted := n.stagedDevice("pv-0")
	if dev != dm || devNum != "254:0" || !cmp.Equal(mounted, []string{dm}) {
		t.Errorf("recorded %s (%s), mounted %v; want %s (254:0) mounted", dev, devNum, mounted, dm)
	}
	if got := n.host.SessionCount(); got != 2 {
		t.Errorf("%d sessions after the stage, want both", got)
	}
	if err := n.unstage("pv-0"); err != nil {
		t.Fatal(err)
	}
	if got := n.host.Maps(); slices.Contains(got, "dm-0") {
		t.Errorf("maps after the unstage: %v, want dm-0 flushed", got)
	}
}

// A disk something other than the LUN's multipath map took before the
// mount is not mounted: the stage fails Unavailable (kubelet retries) and
// is undone.
func TestStage_ISCSIDiskHeldByAnotherDeviceFailsRetryably(t *testing.T) {
	n := newNode(t)
	n.host.Multipathd = false
	n.mnt.set(func(source, _ string) error {
		if err := iscsitest.AddMap(n.host.Sys, iscsitest.Map{Device: "dm-7", Name: "vg-lv", UUID: "LVM-abc", Slaves: []string{filepath.Base(source)}}); err != nil {
			t.Fatal(err)
		}
		return errors.New("mount: " + source + ": already mounted or mount point busy")
	})
	err := n.stage("pv-0", iscsiVolumeContext(0), false)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "held by dm-7, which is not a multipath map of the LUN") {
		t.Fatalf("stage: %v; want Unavailable naming dm-7", err)
	}
	if _, err := n.store.Get("pv-0"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("record after the failed stage: %v", err)
	}
	if got := n.host.SessionCount(); got != 0 {
		t.Errorf("%d sessions after the failed stage, want none", got)
	}
}
