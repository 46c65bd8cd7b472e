package nvme

import (
	"strconv"
	"strings"
)

// ControllerName is the kernel name of an NVMe controller, "nvme3": the
// entry below class/nvme. The number is the controller instance; a
// re-created controller usually gets a new one.
type ControllerName string

// SubsystemName is the kernel name of an NVMe subsystem instance,
// "nvme-subsys0": the entry below class/nvme-subsystem. Its number is
// independent of the numbers of the controllers it holds.
type SubsystemName string

// DeviceName is the name of an NVMe namespace block device: a multipath
// head or per-controller disk "nvme0n1", or a hidden multipath leg
// "nvme0c1n1".
type DeviceName string

const (
	controllerPrefix = "nvme"
	subsystemPrefix  = "nvme-subsys"
)

// Instance returns the controller instance number, or -1 when the name is
// not of the form "nvme<N>".
func (c ControllerName) Instance() int { return parseInstance(string(c), controllerPrefix) }

// Instance returns the subsystem instance number, or -1 when the name is
// not of the form "nvme-subsys<N>".
func (s SubsystemName) Instance() int { return parseInstance(string(s), subsystemPrefix) }

// parseInstance parses "<prefix><decimal>" and returns the number, or -1.
// Leading zeros are refused: the kernel never prints them, so a name with
// them is not one of its names.
func parseInstance(name, prefix string) int {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return -1
	}
	return parseDecimal(digits)
}

// parseDecimal parses a kernel-printed non-negative int ("%d"), or -1.
func parseDecimal(s string) int {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return -1
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// diskName is a parsed namespace block device name. The kernel names them
// (drivers/nvme/host/multipath.c, nvme_mpath_set_disk_name, and core.c,
// nvme_alloc_ns):
//
//	nvme<S>n<H>     multipath head: S = subsystem instance, H = head instance
//	nvme<S>c<C>n<H> hidden leg of head H through controller instance C
//	nvme<C>n<H>     per-controller disk when native multipath is off
//
// The head instance H is allocated per subsystem, so every device of one
// namespace shares it.
type diskName struct {
	first int // S for heads and legs, C for per-controller disks
	ctrl  int // C of a leg; -1 otherwise
	head  int // H
}

// parseDiskName parses a head, leg or per-controller disk name. ok is false
// for anything else (controller names, "ng0n1" character devices).
func parseDiskName(name string) (d diskName, ok bool) {
	rest, found := strings.CutPrefix(name, controllerPrefix)
	if !found {
		return diskName{}, false
	}
	first, rest, found := strings.Cut(rest, "n")
	if !found {
		return diskName{}, false
	}
	d = diskName{ctrl: -1, head: parseDecimal(rest)}
	if s, c, isLeg := strings.Cut(first, "c"); isLeg {
		d.first, d.ctrl = parseDecimal(s), parseDecimal(c)
		if d.ctrl < 0 {
			return diskName{}, false
		}
	} else {
		d.first = parseDecimal(first)
	}
	if d.first < 0 || d.head < 0 {
		return diskName{}, false
	}
	return d, true
}

// isLeg reports whether the name is a hidden multipath leg.
func (d diskName) isLeg() bool { return d.ctrl >= 0 }

// headName is the name of the multipath head a leg belongs to.
func (d diskName) headName() DeviceName {
	return DeviceName(controllerPrefix + strconv.Itoa(d.first) + "n" + strconv.Itoa(d.head))
}
