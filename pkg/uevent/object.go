package uevent

import (
	"strings"
)

// Kind is the kind of kernel object an event names.
type Kind string

// The kinds of object the events of NVMe-oF, iSCSI and dm-multipath
// paths name (docs/uevents.md lists which event names which, as the lab's
// 6.1 kernel sends them).
const (
	// NVMeController: a controller, "nvme3" (class/nvme/nvme3; DEVPATH
	// …/nvme-fabrics/ctl/nvme3).
	NVMeController Kind = "nvme-controller"
	// NVMeSubsystem: a subsystem instance, "nvme-subsys0"
	// (class/nvme-subsystem/nvme-subsys0), the parent of its heads.
	NVMeSubsystem Kind = "nvme-subsystem"
	// NVMeLeg: a hidden multipath leg, "nvme0c1n1": a head's path through
	// one controller, below that controller's DEVPATH.
	NVMeLeg Kind = "nvme-leg"
	// ISCSISession: an iSCSI session, "session5"
	// (class/iscsi_session/session5); the parent of its SCSI target.
	ISCSISession Kind = "iscsi-session"
	// ISCSIConnection: a session's connection, "connection5:0"; its
	// Session names the session.
	ISCSIConnection Kind = "iscsi-connection"
	// SCSIHost: a SCSI host, "host2" (an iSCSI session's parent).
	SCSIHost Kind = "scsi-host"
	// SCSIDevice: a SCSI device (a LUN), "2:0:0:1" (H:C:T:L).
	SCSIDevice Kind = "scsi-device"
	// Block: a block device, "nvme0n1" (a head, or a per-controller
	// namespace), "sdc", "dm-1".
	Block Kind = "block"
)

// Object is one kernel object an event names.
type Object struct {
	Kind Kind
	// Name is the kernel's name of it ("nvme3", "session5", "2:0:0:1",
	// "sdc").
	Name string
}

// Session is the session an iSCSI session or connection object belongs
// to ("session5"); "" for other kinds.
func (o Object) Session() string {
	switch o.Kind {
	case ISCSISession:
		return o.Name
	case ISCSIConnection:
		n, _, _ := strings.Cut(strings.TrimPrefix(o.Name, "connection"), ":")
		return "session" + n
	}
	return ""
}

func (o Object) String() string { return string(o.Kind) + " " + o.Name }

// Objects returns the kernel objects e names, the object itself first,
// then its ancestors in DEVPATH that pathmend tells apart (a disk's SCSI
// device, session and host; a head's subsystem; a leg's controller),
// each once. An event that names none of these returns nil.
//
// The DEVPATHs this reads, as the 6.1 kernel forms them:
//
//	/devices/virtual/nvme-fabrics/ctl/nvme3                   nvme controller
//	/devices/virtual/nvme-fabrics/ctl/nvme3/nvme0c3n1         block (hidden leg)
//	/devices/virtual/nvme-subsystem/nvme-subsys0              nvme-subsystem
//	/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1      block (head)
//	/devices/platform/host2/session1                          (session device)
//	/devices/platform/host2/session1/iscsi_session/session1   iscsi_session
//	/devices/platform/host2/session1/connection1:0/iscsi_connection/connection1:0
//	/devices/platform/host2/session1/target2:0:0/2:0:0:1      scsi device
//	/devices/platform/host2/session1/target2:0:0/2:0:0:1/block/sdc
//	/devices/virtual/block/dm-1                               dm map
func Objects(e Event) []Object {
	elems := strings.Split(strings.TrimPrefix(e.DevPath, "/"), "/")
	var out []Object
	seen := map[Object]bool{}
	add := func(o Object) {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	for i := len(elems) - 1; i >= 0; i-- {
		name := elems[i]
		if i == len(elems)-1 && e.Subsystem == "block" {
			if name != "" {
				add(Object{Kind: blockKind(name), Name: name})
			}
			continue
		}
		if k, ok := kindOf(name); ok {
			add(Object{Kind: k, Name: name})
		}
	}
	return out
}

// blockKind tells a hidden NVMe leg from the other block devices.
func blockKind(name string) Kind {
	if isLeg(name) {
		return NVMeLeg
	}
	return Block
}

// kindOf classifies one DEVPATH element that is not the block device
// itself.
func kindOf(name string) (Kind, bool) {
	switch {
	case digitsAfter(name, "nvme-subsys"):
		return NVMeSubsystem, true
	case digitsAfter(name, "nvme"):
		return NVMeController, true
	case isLeg(name):
		return NVMeLeg, true
	case digitsAfter(name, "session"):
		return ISCSISession, true
	case strings.HasPrefix(name, "connection"):
		s, c, ok := strings.Cut(strings.TrimPrefix(name, "connection"), ":")
		if ok && digits(s) && digits(c) {
			return ISCSIConnection, true
		}
	case digitsAfter(name, "host"):
		return SCSIHost, true
	case isHCTL(name):
		return SCSIDevice, true
	}
	return "", false
}

// isLeg reports whether name is "nvme<S>c<C>n<H>".
func isLeg(name string) bool {
	rest, ok := strings.CutPrefix(name, "nvme")
	if !ok {
		return false
	}
	s, rest, ok := strings.Cut(rest, "c")
	if !ok || !digits(s) {
		return false
	}
	c, h, ok := strings.Cut(rest, "n")
	return ok && digits(c) && digits(h)
}

func isHCTL(name string) bool {
	parts := strings.Split(name, ":")
	if len(parts) != 4 {
		return false
	}
	for _, p := range parts {
		if !digits(p) {
			return false
		}
	}
	return true
}

func digitsAfter(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	return ok && digits(rest)
}

func digits(s string) bool {
	if s == "" || len(s) > 9 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Relevant reports whether e may change the state of a path pathmend
// keeps: an NVMe controller, subsystem or namespace; an iSCSI session or
// connection; a SCSI device or SCSI disk; a dm map. Everything else the
// kernel announces (loop devices, partitions' siblings, network
// interfaces, the generic char devices) is not.
func Relevant(e Event) bool {
	switch e.Subsystem {
	case "nvme", "nvme-subsystem", "iscsi_session", "iscsi_connection":
		return len(Objects(e)) > 0
	case "scsi":
		return e.Get("DEVTYPE") == "scsi_device"
	case "block":
		name := e.Name()
		return strings.HasPrefix(name, "nvme") || strings.HasPrefix(name, "sd") || strings.HasPrefix(name, "dm-")
	}
	return false
}
