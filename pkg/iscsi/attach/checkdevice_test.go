package attach

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// attachedRecord attaches pv-1 through both portals while multipathd is
// not running, so the attach settles for the first disk, and returns the
// record the driver makes of it.
func attachedRecord(t *testing.T, h *fakeHost, a *Attacher) volume.Record {
	t.Helper()
	h.Multipathd = false
	vc := iscsiVolume(0, "127.0.0.1", "127.0.0.2")
	dev, err := attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: vc})
	if err != nil {
		t.Fatal(err)
	}
	if want := (volume.Device{Path: filepath.Join(h.dev, "sda"), SizeBytes: 64 << 20, Number: volume.DeviceNumber{Major: 8}}); dev != want {
		t.Fatalf("attached %+v, want %+v", dev, want)
	}
	rec := record("pv-1", vc, dev.Path)
	rec.DevNum = dev.Number
	return rec
}

// The sequence the kubelet lab met: the attach found no map within the
// wait and settled for sda; multipathd then assembled the map over sda
// and sdc before the mount. CheckDevice names the map, as the attach
// would have had the map been there in time.
func TestCheckDevice_MapAssembledAfterTheFallbackIsUsed(t *testing.T) {
	h := newFakeHost(t)
	a := h.attacher(nil)
	rec := attachedRecord(t, h, a)

	dev, err := a.CheckDevice(context.Background(), rec)
	if err != nil {
		t.Fatalf("no map yet: %v", err)
	}
	if want := (volume.Device{Path: rec.Device, SizeBytes: 64 << 20, Number: volume.DeviceNumber{Major: 8}}); dev != want {
		t.Errorf("no map yet: %+v, want the disk %+v", dev, want)
	}

	h.StartMultipathd()
	dev, err = a.CheckDevice(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(volume.Device{Path: filepath.Join(h.dev, "dm-0"), SizeBytes: 64 << 20, Number: volume.DeviceNumber{Major: 254}}, dev); diff != "" {
		t.Errorf("after the map (-want +got):\n%s", diff)
	}
	// The map's own record is left as it is.
	rec.Device, rec.DevNum = dev.Path, dev.Number
	if again, err := a.CheckDevice(context.Background(), rec); err != nil || again != dev {
		t.Errorf("map: %+v, %v; want %+v", again, err, dev)
	}
}

// A disk taken by anything but a multipath map of its LUN is not used:
// the error is retryable (volume.ErrUnavailable) and says what holds it.
func TestCheckDevice_DiskHeldByAnotherDeviceIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(t *testing.T, h *fakeHost)
		want string
	}{{
		name: "a device-mapper device that is not a multipath map",
		take: func(t *testing.T, h *fakeHost) {
			if err := iscsitest.AddMap(h.sys, iscsitest.Map{Device: "dm-7", Name: "vg-lv", UUID: "LVM-abc", Slaves: []string{"sda"}}); err != nil {
				t.Fatal(err)
			}
		},
		want: "held by dm-7, which is not a multipath map of the LUN",
	}, {
		name: "a multipath map that also holds a foreign disk",
		take: func(t *testing.T, h *fakeHost) {
			h.MapExtra[0] = []string{"sdz"}
			h.StartMultipathd()
		},
		want: "holds sdz, which is not a path of LUN",
	}, {
		name: "a multipath map of another size",
		take: func(t *testing.T, h *fakeHost) {
			h.MapSectors = 2048
			h.StartMultipathd()
		},
		want: "has 1048576 bytes, its path sda has 67108864",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			a := h.attacher(nil)
			rec := attachedRecord(t, h, a)
			tc.take(t, h)
			dev, err := a.CheckDevice(context.Background(), rec)
			if err == nil {
				t.Fatalf("got %+v, want an error", dev)
			}
			if !errors.Is(err, volume.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want volume.ErrUnavailable and %q", err, tc.want)
			}
		})
	}
}

// A disk that went, or whose name another device now carries, is not
// the attached device any more.
func TestCheckDevice_DiskGoneOrRenumberedIsRefused(t *testing.T) {
	h := newFakeHost(t)
	a := h.attacher(nil)
	rec := attachedRecord(t, h, a)
	renumbered := rec
	renumbered.DevNum = volume.DeviceNumber{Major: 8, Minor: 16}
	if _, err := a.CheckDevice(context.Background(), renumbered); !errors.Is(err, volume.ErrUnavailable) || !strings.Contains(err.Error(), "is now device 8:0, not 8:16") {
		t.Errorf("renumbered: %v", err)
	}
	gone := rec
	gone.Device = filepath.Join(h.dev, "sdq")
	if _, err := a.CheckDevice(context.Background(), gone); !errors.Is(err, volume.ErrUnavailable) {
		t.Errorf("gone: %v, want volume.ErrUnavailable", err)
	}
	outside := rec
	outside.Device = "/elsewhere/sda"
	if _, err := a.CheckDevice(context.Background(), outside); err == nil {
		t.Error("a device outside the device root was accepted")
	}
}
