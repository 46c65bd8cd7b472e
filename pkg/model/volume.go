package model

import (
	"slices"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Scope says whose a volume is.
type Scope string

const (
	// Owned: a staged-volume record of this node plugin names the volume.
	Owned Scope = "owned"
	// Foreign: another CSI driver attached it; pathmend learned its
	// endpoints (companion mode's scope). Its ID is the target's name.
	Foreign Scope = "foreign"
)

// PathState is what one expected path of a volume is now.
type PathState string

const (
	// PathLive: the path carries I/O (a live controller with a usable leg
	// to the namespace; a LOGGED_IN session whose LUN is running).
	PathLive PathState = "live"
	// PathDown: a kernel object serves the endpoint but carries no I/O now
	// (a controller connecting or without a leg, an ANA state that is not
	// usable, a session out of LOGGED_IN, a LUN blocked).
	PathDown PathState = "down"
	// PathAbsent: no kernel object serves the endpoint.
	PathAbsent PathState = "absent"
)

// Path is one expected path of a volume: an endpoint (or portal) the
// volume lists.
type Path struct {
	// Endpoint is host:port as the volume lists it.
	Endpoint string
	// Object is the kernel object that serves it ("nvme4", "session5");
	// empty when none does.
	Object string
	// State is the path's state.
	State PathState
	// Optimized is set on a live path whose ANA state is optimized (or
	// that has no ANA state): what the volume prefers to send I/O down.
	Optimized bool
	// Detail says what is wrong in the kernel's words ("nvme4
	// connecting", "session5 (127.0.0.2:3260) FAILED"); empty when live.
	Detail string
	// Since is when the model first saw the path in this state, with this
	// object (the ReadAt of that read); set by the model.
	Since time.Time
}

// Fact is a condition of a volume another package adds (a filesystem's
// health, …), with the time of the read it reflects.
type Fact struct {
	Condition volume.Condition
	ReadAt    time.Time
}

// Volume is what the model holds of one volume. Values read from a
// Snapshot share their slices and maps with the model: never mutate them.
type Volume struct {
	// ID is the CSI volume ID (Owned) or the target's name (Foreign).
	ID     string
	Target volume.Target
	Scope  Scope
	// Paths are the expected paths, in the order the volume lists them.
	Paths []Path
	// Devices are the block devices the volume's namespace or LUN has now
	// (a multipath head; a map and its disks), with their numbers.
	Devices []volume.BlockDevice
	// Held is the device the volume's users hold (its staging mount's, a
	// publication's); nil when unknown.
	Held *volume.StagedDevice
	// Condition is the volume's condition: its paths graded, or a device
	// the kernel replaced under its users (volume.Replaced).
	Condition volume.Condition
	// Notes are what the loop decided about the volume in the tick that
	// wrote it: a repair deferred and why, an endpoint backed off.
	Notes []string
	// Facts are the conditions other packages added, by their name.
	Facts map[string]Fact
	// ReadAt is the time of the kernel read the entry reflects.
	ReadAt time.Time
	// Gen is the model generation that last changed the entry.
	Gen uint64
}

// Age is how old the entry's read is at now.
func (v Volume) Age(now time.Time) time.Duration { return now.Sub(v.ReadAt) }

// Live counts the live paths, and the live optimized ones.
func (v Volume) Live() (live, optimized int) {
	for _, p := range v.Paths {
		if p.State == PathLive {
			live++
			if p.Optimized {
				optimized++
			}
		}
	}
	return live, optimized
}

// Conditions are the volume's abnormal conditions as the RPCs report
// them: its condition first, the loop's notes appended to its message,
// then each abnormal fact, by name. A healthy volume with no abnormal
// fact has none.
//
// A volume whose staged device the kernel replaced (StagedDeviceReplaced)
// has that one condition: what its facts say is about the filesystem on
// the removed device, which fails because the device is gone (ext4
// remounts it read-only at its next write, seen in the lab seconds to
// minutes after the removal), and its remedy is the replaced device's —
// the pods restarted, the volume staged again on the new device. Each
// abnormal fact is told in that condition's message instead, so a pod's
// status names the cause once, not a cause and its consequence as two
// problems.
func (v Volume) Conditions() []volume.Condition {
	var out []volume.Condition
	names := make([]string, 0, len(v.Facts))
	for name, f := range v.Facts {
		if f.Condition.Abnormal() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if v.Condition.Abnormal() {
		c := v.Condition
		if len(v.Notes) > 0 {
			c.Message += "; " + strings.Join(v.Notes, "; ")
		}
		if c.Reason == volume.ReasonStagedDeviceReplaced {
			for _, name := range names {
				f := v.Facts[name].Condition
				c.Message += "; on the removed device, " + f.Reason + ": " + f.Message
			}
			return append(out, c)
		}
		out = append(out, c)
	}
	for _, name := range names {
		out = append(out, v.Facts[name].Condition)
	}
	return out
}

// sameContent reports whether a and b hold the same state (what a read
// sets; not ReadAt, Gen or Facts, which the model keeps).
func sameContent(a, b *Volume) bool {
	return a.ID == b.ID && a.Target == b.Target && a.Scope == b.Scope &&
		slices.Equal(a.Paths, b.Paths) && slices.Equal(a.Devices, b.Devices) &&
		sameHeld(a.Held, b.Held) && sameCondition(a.Condition, b.Condition) && slices.Equal(a.Notes, b.Notes)
}

func sameHeld(a, b *volume.StagedDevice) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameCondition(a, b volume.Condition) bool {
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message && slices.Equal(a.Devices, b.Devices)
}

// sameObjects reports whether a and b name the same kernel objects, in
// the same order (what objects returns), without building the lists.
func sameObjects(a, b *Volume) bool {
	if !slices.EqualFunc(a.Devices, b.Devices, func(x, y volume.BlockDevice) bool { return x.Name == y.Name }) {
		return false
	}
	i, j := 0, 0
	for {
		for i < len(a.Paths) && a.Paths[i].Object == "" {
			i++
		}
		for j < len(b.Paths) && b.Paths[j].Object == "" {
			j++
		}
		if i == len(a.Paths) || j == len(b.Paths) {
			return i == len(a.Paths) && j == len(b.Paths)
		}
		if a.Paths[i].Object != b.Paths[j].Object {
			return false
		}
		i, j = i+1, j+1
	}
}

// objects are the kernel object names v names: its paths' objects and
// its devices.
func (v *Volume) objects() []string {
	out := make([]string, 0, len(v.Paths)+len(v.Devices))
	for _, p := range v.Paths {
		if p.Object != "" {
			out = append(out, p.Object)
		}
	}
	for _, d := range v.Devices {
		out = append(out, d.Name)
	}
	return out
}
