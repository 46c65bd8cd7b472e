package nvme

import (
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// CurrentDevices returns the block devices the namespace of e has in h —
// its multipath head, or with multipath off its disk on every controller
// — with their numbers from block/<dev>/dev; nil when h has no such
// namespace. A device whose number cannot be read (it vanished since the
// read) is left out. It is what a staged volume's device is compared
// with: a head the kernel removed and created again has a new number.
func CurrentDevices(fsys sysfs.FS, h *Host, e Expectation) []volume.BlockDevice {
	loc, err := Locate(h, e)
	if err != nil {
		return nil
	}
	ns := loc.Namespace
	if ns.Head != "" && !ns.Dev.IsZero() {
		return []volume.BlockDevice{{Name: string(ns.Head), Number: ns.Dev}} // read once per head
	}
	var out []volume.BlockDevice
	for _, d := range ns.Devices() {
		if n, err := DeviceNumberOf(fsys, d); err == nil {
			out = append(out, volume.BlockDevice{Name: string(d), Number: n})
		}
	}
	return out
}

// DeviceNumberOf reads block/<d>/dev.
func DeviceNumberOf(fsys sysfs.FS, d DeviceName) (volume.DeviceNumber, error) {
	s, err := fsys.ReadAttr("block/" + string(d) + "/dev")
	if err != nil {
		return volume.DeviceNumber{}, err
	}
	return volume.ParseDeviceNumber(s)
}

// OptionalDeviceNumberOf reads block/<d>/dev; zero when the attribute is
// absent (a capture of an older tree), an error when it cannot be read or
// parsed.
func OptionalDeviceNumberOf(fsys sysfs.FS, d DeviceName) (volume.DeviceNumber, error) {
	s, ok, err := fsys.ReadOptionalAttr("block/" + string(d) + "/dev")
	if err != nil || !ok {
		return volume.DeviceNumber{}, err
	}
	return volume.ParseDeviceNumber(s)
}
