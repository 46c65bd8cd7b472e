package volume

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DeviceNumber is a block device's number (dev_t) as the kernel prints
// it, major:minor: sysfs block/<dev>/dev, a device node's st_rdev, the
// major:minor of a mount in /proc/self/mountinfo. It is a device's
// identity: a name is not one (the kernel reuses names, and one device
// has several), while a number stays the device's until the kernel frees
// it, which it does not while a mount or an open file holds the device.
type DeviceNumber struct {
	Major, Minor uint32
}

// ParseDeviceNumber parses "259:3".
func ParseDeviceNumber(s string) (DeviceNumber, error) {
	maj, min, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return DeviceNumber{}, fmt.Errorf("device number %q: want major:minor", s)
	}
	ma, err := strconv.ParseUint(maj, 10, 32)
	if err != nil {
		return DeviceNumber{}, fmt.Errorf("device number %q: major: %w", s, err)
	}
	mi, err := strconv.ParseUint(min, 10, 32)
	if err != nil {
		return DeviceNumber{}, fmt.Errorf("device number %q: minor: %w", s, err)
	}
	return DeviceNumber{Major: uint32(ma), Minor: uint32(mi)}, nil
}

// String renders "259:3".
func (n DeviceNumber) String() string { return fmt.Sprintf("%d:%d", n.Major, n.Minor) }

// IsZero reports whether the number is unknown (0:0 is no block device).
func (n DeviceNumber) IsZero() bool { return n == DeviceNumber{} }

// MarshalText renders the number as "259:3" in JSON.
func (n DeviceNumber) MarshalText() ([]byte, error) { return []byte(n.String()), nil }

// UnmarshalText parses "259:3".
func (n *DeviceNumber) UnmarshalText(b []byte) error {
	v, err := ParseDeviceNumber(string(b))
	if err != nil {
		return err
	}
	*n = v
	return nil
}

// NodeNumber returns the device number of path when it is a block device
// node. A node keeps the number it was made with: a device node bound at a
// block volume's publication still names the device the pod was given,
// even after the kernel removed it.
func NodeNumber(path string) (DeviceNumber, bool) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return DeviceNumber{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return DeviceNumber{}, false
	}
	rdev := uint64(st.Rdev)
	return DeviceNumber{Major: unix.Major(rdev), Minor: unix.Minor(rdev)}, true
}

// BlockDevice is a block device as the kernel names and numbers it.
type BlockDevice struct {
	// Name is the kernel's name, e.g. "nvme0n3", "dm-1", "sdc".
	Name string
	// Number is its device number; zero when it could not be read.
	Number DeviceNumber
}

// String renders "nvme0n3 (259:7)".
func (d BlockDevice) String() string {
	if d.Number.IsZero() {
		return d.Name
	}
	return fmt.Sprintf("%s (%s)", d.Name, d.Number)
}

// StagedDevice is the block device the users of a staged volume hold, and
// where pathmend found it.
type StagedDevice struct {
	Device BlockDevice
	// From says where: "the staging mount at …", "the publication at …"
	// or "the record".
	From string
}

// Mount is one entry of the mount table: where, and the device number of
// the mounted filesystem (mountinfo's major:minor).
type Mount struct {
	Path   string
	Source string
	Number DeviceNumber
	// ID and Parent are the mount's ID and its parent's; Root and FSType
	// the root and type of the filesystem mounted (mountinfo fields 1, 2,
	// 4 and 9): what tells the mount pathmend made from another one at
	// the same path.
	ID, Parent   int
	Root, FSType string
}

// FindStagedDevice returns the device the users of rec hold. For a
// filesystem volume it is the topmost mount at the staging path (mounts
// lists the mount table in order); for a block volume, the device node
// bound at a publication (rdevOf returns a path's device number when it
// is a block device node), else the number the record keeps. ok is false
// when none is known: a filesystem volume with nothing mounted at its
// staging path, a record written without the number.
func FindStagedDevice(rec Record, mounts []Mount, rdevOf func(path string) (DeviceNumber, bool)) (StagedDevice, bool) {
	name := path.Base(rec.Device)
	if rec.AccessType == AccessMount {
		var top *Mount
		for i := range mounts {
			if mounts[i].Path == rec.StagingPath {
				top = &mounts[i]
			}
		}
		if top == nil || top.Number.IsZero() {
			return StagedDevice{}, false
		}
		if strings.HasPrefix(top.Source, "/dev/") {
			name = path.Base(top.Source)
		}
		return StagedDevice{Device: BlockDevice{Name: name, Number: top.Number}, From: "the staging mount at " + rec.StagingPath}, true
	}
	for _, p := range rec.Publications {
		if n, ok := rdevOf(p.TargetPath); ok {
			return StagedDevice{Device: BlockDevice{Name: name, Number: n}, From: "the publication at " + p.TargetPath}, true
		}
	}
	if rec.DevNum.IsZero() {
		return StagedDevice{}, false
	}
	return StagedDevice{Device: BlockDevice{Name: name, Number: rec.DevNum}, From: "the record"}, true
}

// ReasonStagedDeviceReplaced is the Condition reason of a volume whose
// staged device is no longer its device.
const ReasonStagedDeviceReplaced = "StagedDeviceReplaced"

// Replaced compares a staged volume's staged device with the devices its
// namespace or LUN has now (current, as its transport read them) and,
// when the staged one is not among them, returns the condition that says
// so: Inaccessible, ReasonStagedDeviceReplaced, and a message saying what
// happened and what to do. removed says whether the staged device number
// is gone from the kernel. ok is false when the staged device is current,
// or when there is nothing to compare with (the volume has no device now:
// its paths' condition says why).
func Replaced(rec Record, staged StagedDevice, current []BlockDevice, removed bool) (c Condition, ok bool) {
	if len(current) == 0 {
		return Condition{}, false
	}
	names := make([]string, 0, len(current))
	for _, d := range current {
		if d.Number == staged.Device.Number {
			return Condition{}, false
		}
		names = append(names, d.String())
	}
	what := "filesystem"
	if rec.AccessType == AccessBlock {
		what = "block device"
	}
	gone := "which is no longer the volume's device"
	if removed {
		gone = "which the kernel removed (the volume lost every path for a while, or its namespace or LUN was removed and added again)"
	}
	msg := fmt.Sprintf("the %s of volume %s held by %s is on %s, %s; the volume's device is now %s. "+
		"I/O through the staged %s fails until the volume is staged again: restart the pods that use it, so that kubelet unpublishes and unstages it and the next NodeStage attaches the new device (the data on the volume is not lost)",
		what, rec.VolumeID, staged.From, staged.Device, gone, strings.Join(names, ", "), what)
	return Condition{Status: Inaccessible, Reason: ReasonStagedDeviceReplaced, Message: msg}, true
}
