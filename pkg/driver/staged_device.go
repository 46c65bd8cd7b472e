package driver

import (
	"path/filepath"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The staged device of a volume is the block device its users hold: the
// device of the filesystem mounted at the staging path, or the device node
// bound at a block volume's publications. When every path of a volume is
// lost for a while, Linux removes its block device (an NVMe head without
// paths, an iSCSI disk whose session was logged out) and creates a new one
// — a new name and a new number — when the paths return; the staging
// mount stays on the removed device, and every read and write through it
// fails. The transport's health of the paths looks fine again. These
// functions tell the two apart by device number, never by name.

// mounts reads the mount table through the MountTable seam, as
// volume.Mounts (readMountTable).
func (d *Driver) mounts() ([]volume.Mount, error) {
	mt := d.readMountTable()
	return mt.mounts, mt.err
}

// MountsOf turns the mount table as k8s mount-utils parses mountinfo into
// volume.Mounts, keeping each mount's device number.
func MountsOf(infos []mount.MountInfo) []volume.Mount {
	out := make([]volume.Mount, 0, len(infos))
	for _, mi := range infos {
		out = append(out, volume.Mount{Path: filepath.Clean(mi.MountPoint), Source: mi.Source,
			Number: volume.DeviceNumber{Major: uint32(mi.Major), Minor: uint32(mi.Minor)},
			ID:     mi.ID, Parent: mi.ParentID, Root: mi.Root, FSType: mi.FsType})
	}
	return out
}

// rdevOf returns the device number of path when it is a block device
// node.
func rdevOf(path string) (volume.DeviceNumber, bool) { return volume.NodeNumber(path) }

// stagedDevice finds the device the users of rec hold, in mounts: for a
// filesystem volume, the volume's own staging mount (layers.go), not
// whatever someone mounted on top of it or over its path.
func (d *Driver) stagedDevice(rec volume.Record, ms []volume.Mount) (volume.StagedDevice, bool) {
	c := stagingClaim(rec)
	// mountinfo lists resolved paths.
	rec.StagingPath = c.path
	if rec.AccessType == volume.AccessMount {
		ns, err := d.deps.MountNamespace()
		if err != nil {
			return volume.StagedDevice{}, false
		}
		v := layerView{ns: ns}
		ours := make([]volume.Mount, 0, 2)
		for _, m := range ms {
			if m.Path == c.path && c.ours(v, mounts.Layer{ID: m.ID, Parent: m.Parent, Dev: m.Number, Root: m.Root, MountPoint: m.Path, FSType: m.FSType, Source: m.Source}) {
				ours = append(ours, m)
			}
		}
		ms = ours
	}
	return volume.FindStagedDevice(rec, ms, rdevOf)
}

// replacedCondition returns the condition of a staged volume whose staged
// device is not one of the devices c (its transport's health, read now)
// says the volume has; ok is false when it is one, or when either side is
// unknown.
func (d *Driver) replacedCondition(rec volume.Record, mounts []volume.Mount, c volume.Condition) (volume.Condition, bool) {
	staged, ok := d.stagedDevice(rec, mounts)
	if !ok {
		return volume.Condition{}, false
	}
	// sysfs lists every registered block device number under dev/block.
	_, err := d.deps.SysFS.Stat("dev/block/" + staged.Device.Number.String())
	return volume.Replaced(rec, staged, c.Devices, err != nil)
}

// replacedBy reads the mount table and returns, given the volume's
// health, the condition of a volume whose staged device was replaced; ok
// is false otherwise (also when the mount table cannot be read).
func (d *Driver) replacedBy(rec volume.Record, health volume.Condition) (volume.Condition, bool) {
	mounts, err := d.mounts()
	if err != nil {
		return volume.Condition{}, false
	}
	return d.replacedCondition(rec, mounts, health)
}

// StagedDevices returns the device the users of each staged volume in
// recs hold, by volume ID, reading the mount table once (and the device
// node of each block volume's publication); a volume whose staged device
// is unknown is left out. The monitor compares them with the devices it
// reads for the volumes every tick (pathmend_volume_staged_device_replaced).
func (d *Driver) StagedDevices(recs []volume.Record) (map[string]volume.StagedDevice, error) {
	mounts, err := d.mounts()
	if err != nil {
		return nil, err
	}
	out := make(map[string]volume.StagedDevice, len(recs))
	for _, rec := range recs {
		if s, ok := d.stagedDevice(rec, mounts); ok {
			out[rec.VolumeID] = s
		}
	}
	return out, nil
}

// attachedNumber returns the device number of an attached device: the
// transport's (read from sysfs) when the device node agrees, the node's
// when the transport read none. A node of another number is stale (an
// earlier device of the same name): an error.
func attachedNumber(dev volume.Device) (volume.DeviceNumber, error) {
	n, ok := rdevOf(dev.Path)
	switch {
	case !ok:
		return dev.Number, nil
	case dev.Number.IsZero():
		return n, nil
	case n != dev.Number:
		return volume.DeviceNumber{}, internal(nil, "device node %s is device %s, the kernel's device is %s", dev.Path, n, dev.Number)
	}
	return n, nil
}
