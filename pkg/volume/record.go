package volume

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// AccessType is how a staged volume is presented to workloads.
type AccessType string

const (
	// AccessMount volumes carry a file system mounted at the staging path.
	AccessMount AccessType = "mount"
	// AccessBlock volumes are handed to workloads as a raw block device.
	AccessBlock AccessType = "block"
)

// RecordVersion is the record format Put writes. Get and List read every
// version up to it (version 1 records, written before records had a state,
// read as StateStaged; version 2 records, written before records named
// the mount layers pathmend made, read with no layer and no publication
// marked created) and refuse a newer one as written by a newer
// pathmend, naming its target when the envelope says. A change that an
// older plugin would misread must bump it, and every version keeps the
// envelope: "version", "volumeID", "context.transport", "context.nvme.nqn"
// and "context.iscsi.iqn" at these paths with these meanings. Version 3
// is such a change: a version 2 pathmend would ignore the layers and
// unmount whatever is mounted at a recorded path.
const RecordVersion = 3

// State is where a volume is in its node lifecycle. The state is on disk
// before the kernel is touched, so a crash at any point leaves a record
// that says what may exist (docs/state.md).
type State string

const (
	// StateAttaching is written before the first connect or login of a
	// NodeStage: paths, sessions or node records of the volume may exist,
	// and its device may be formatted or mounted at the staging path.
	StateAttaching State = "attaching"
	// StateStaged is written when NodeStage succeeded.
	StateStaged State = "staged"
	// StateDetaching is written before the first teardown of a
	// NodeUnstage, after the staging path was unmounted: nothing of the
	// volume is in use, and some of its paths may be gone already.
	StateDetaching State = "detaching"
)

// Known reports whether s is one of the states above.
func (s State) Known() bool {
	switch s {
	case StateAttaching, StateStaged, StateDetaching:
		return true
	}
	return false
}

// Record is what the plugin knows about one staged volume: enough for a
// restarted plugin to find, verify and tear down what it attached, and for
// the monitor to know which paths each volume expects. It never holds
// secrets; there is no field that could.
type Record struct {
	// Version is the record format; Put sets it to RecordVersion.
	Version int `json:"version"`
	// VolumeID is the CSI volume ID, any non-empty UTF-8 string.
	VolumeID string `json:"volumeID"`
	// State is the volume's lifecycle state (version 2; a version 1
	// record reads as StateStaged).
	State State `json:"state"`
	// StateSince is when the record entered State, from the writer's
	// clock (a version 1 record reads StagedAt).
	StateSince time.Time `json:"stateSince"`
	// Context is the parsed volume context the volume was staged with.
	Context Context `json:"context"`
	// StagingPath is the staging target path given by kubelet.
	StagingPath string `json:"stagingPath"`
	// AccessType is mount or block.
	AccessType AccessType `json:"accessType"`
	// FSType and MountFlags are the file system settings of a mount volume;
	// empty for block volumes.
	FSType     string   `json:"fsType,omitempty"`
	MountFlags []string `json:"mountFlags,omitempty"`
	// Device is the verified block device path, e.g. /dev/nvme0n1. It may be
	// empty in a record written before the device was found.
	Device string `json:"device"`
	// DevNum is Device's number when it was staged (sysfs
	// block/<dev>/dev, checked against the device node), as
	// "259:3": the identity of what was staged, which a name is not (a
	// later device of the same name is another device). Zero when the
	// transport did not read it, or in a record written before pathmend
	// kept it.
	DevNum DeviceNumber `json:"devNum,omitzero"`
	// ReadOnly is set when the volume was staged with a read-only access
	// mode (its staging mount is read-only).
	ReadOnly bool `json:"readOnly,omitempty"`
	// StagingLayer is the mount NodeStage made at StagingPath (version
	// 3): the layer NodeUnstage may unmount, and no other. Nil for block
	// access, before the mount, and in an older record.
	StagingLayer *MountLayer `json:"stagingLayer,omitempty"`
	// StagedAt is when the volume was staged, from the caller's clock.
	StagedAt time.Time `json:"stagedAt"`
	// Publications are the target paths the volume is bind-mounted at, as
	// NodePublishVolume made them; target paths are unique. A reader must
	// check that a listed target is still mounted: a node reboot drops
	// mounts, not records.
	Publications []Publication `json:"publications,omitempty"`
}

// MaxPublications bounds the target paths one staged volume may be
// published at on one node: one per pod using it, and kubelet runs 110
// pods per node by default. The bound keeps every record within what the
// store reads back.
const MaxPublications = 256

// Publication is one bind mount of a staged volume at a target path.
type Publication struct {
	// TargetPath is the publish target path given by kubelet.
	TargetPath string `json:"targetPath"`
	// ReadOnly is the readonly flag of the publish request.
	ReadOnly bool `json:"readOnly,omitempty"`
	// Layer is the bind mount NodePublish made at TargetPath (version 3):
	// the layer NodeUnpublish may unmount, and no other. Nil while the
	// publication is only intent (recorded before the mount) and in an
	// older record.
	Layer *MountLayer `json:"layer,omitempty"`
	// Created is set when NodePublish created TargetPath (the directory,
	// or the file a block device is bound onto): NodeUnpublish removes
	// only a path it created, and only when it is empty.
	Created bool `json:"created,omitempty"`
}

// MountLayer identifies one mount pathmend made, as the kernel listed it
// in /proc/self/mountinfo right after the mount. Mount IDs are unique in
// one mount namespace at one time only: the kernel reuses a freed ID, a
// new mount namespace (a restarted plugin container) numbers its copy of
// every mount anew, and a reboot drops every mount. So a layer is the
// same mount only when the namespace and the boot are the recorded ones
// and the ID, the parent, the source, the root, the filesystem type and
// the device number all agree; otherwise the record says only what the
// layer looked like.
type MountLayer struct {
	// ID and Parent are the mount's ID and its parent's (mountinfo fields
	// 1 and 2).
	ID     int `json:"id"`
	Parent int `json:"parent"`
	// Dev is the device number of the mounted filesystem (field 3).
	Dev DeviceNumber `json:"dev"`
	// Root is the directory of the filesystem mounted (field 4): "/" for
	// a filesystem, the device node's path in /dev's filesystem for a
	// block device bound onto a file.
	Root string `json:"root"`
	// FSType and Source are fields 9 and 10.
	FSType string `json:"fsType"`
	Source string `json:"source"`
	// Boot is the kernel's boot ID (/proc/sys/kernel/random/boot_id) and
	// Namespace the mount namespace the ID was read in, as the process
	// that read it saw it (mounts.Namespace: "mnt:[4026532281] pid 1234
	// start 56789"; records written before pathmend kept the process
	// hold the link alone, which never equals a namespace read now).
	Boot      string `json:"boot"`
	Namespace string `json:"namespace"`
}

// String names the layer for messages: "ext4 /dev/nvme0n1 (mount 812)".
func (l MountLayer) String() string {
	return fmt.Sprintf("%s %s (mount %d)", l.FSType, l.Source, l.ID)
}

// Target is the record's target (its context's).
func (r Record) Target() Target { return r.Context.Target() }

// ErrNotFound is wrapped by Store.Get when a volume has no record.
var ErrNotFound = errors.New("no staged-volume record")

// check validates a record before it is written.
func (r Record) check() error {
	if r.VolumeID == "" {
		return errors.New("empty volume ID")
	}
	if !r.State.Known() {
		return fmt.Errorf("volume %q: unknown state %q", r.VolumeID, r.State)
	}
	// encoding/json would silently replace invalid UTF-8, and Get would then
	// no longer find the record under the ID it was put with.
	if !utf8.ValidString(r.VolumeID) {
		return fmt.Errorf("volume ID %q is not valid UTF-8", r.VolumeID)
	}
	switch r.AccessType {
	case AccessMount:
	case AccessBlock:
		if r.FSType != "" || len(r.MountFlags) > 0 {
			return fmt.Errorf("volume %q: fsType and mountFlags apply only to access type %q", r.VolumeID, AccessMount)
		}
	default:
		return fmt.Errorf("volume %q: unknown access type %q", r.VolumeID, r.AccessType)
	}
	if len(r.Publications) > MaxPublications {
		return fmt.Errorf("volume %q: %d publications; at most %d", r.VolumeID, len(r.Publications), MaxPublications)
	}
	// The same JSON replacement would make a path read back as another.
	texts := append([]string{r.StagingPath, r.Device, r.FSType}, r.MountFlags...)
	if l := r.StagingLayer; l != nil {
		texts = append(texts, l.Root, l.FSType, l.Source, l.Boot, l.Namespace)
	}
	for _, p := range r.Publications {
		if l := p.Layer; l != nil {
			texts = append(texts, l.Root, l.FSType, l.Source, l.Boot, l.Namespace)
		}
	}
	for _, p := range texts {
		if !utf8.ValidString(p) {
			return fmt.Errorf("volume %q: %q is not valid UTF-8", r.VolumeID, p)
		}
	}
	// A map keeps the check linear in the number of publications.
	seen := make(map[string]bool, len(r.Publications))
	for i, p := range r.Publications {
		if p.TargetPath == "" {
			return fmt.Errorf("volume %q: publication %d has no target path", r.VolumeID, i)
		}
		if !utf8.ValidString(p.TargetPath) {
			return fmt.Errorf("volume %q: target path %q is not valid UTF-8", r.VolumeID, p.TargetPath)
		}
		if seen[p.TargetPath] {
			return fmt.Errorf("volume %q: target path %s is published twice", r.VolumeID, p.TargetPath)
		}
		seen[p.TargetPath] = true
	}

	// A record must hold a context exactly as Parse returns it, so that
	// comparing it with a freshly parsed request is meaningful.
	c, _, err := Parse(r.Context.Encode(), nil)
	if err != nil {
		return fmt.Errorf("volume %q: context: %w", r.VolumeID, err)
	}
	if !c.Equal(r.Context) {
		return fmt.Errorf("volume %q: context is not in the normalized form Parse returns", r.VolumeID)
	}
	return nil
}

// Clone returns a copy of r that shares nothing mutable with it: its
// slices and the contexts they point at are copied.
func (r Record) Clone() Record {
	r.MountFlags = slices.Clone(r.MountFlags)
	r.Publications = slices.Clone(r.Publications)
	r.Context = r.Context.Clone()
	return r
}

// Clone returns a copy of c that shares nothing mutable with it.
func (c Context) Clone() Context {
	if c.NVMe != nil {
		n := *c.NVMe
		n.Endpoints, n.OptimizedEndpoints = slices.Clone(n.Endpoints), slices.Clone(n.OptimizedEndpoints)
		for _, p := range []**int{&n.CtrlLossTmo, &n.ReconnectDelay, &n.FastIOFailTmo, &n.KeepAliveTmo, &n.NrIOQueues} {
			if *p != nil {
				v := **p
				*p = &v
			}
		}
		c.NVMe = &n
	}
	if c.ISCSI != nil {
		i := *c.ISCSI
		i.Portals = slices.Clone(i.Portals)
		if i.ReplacementTimeout != nil {
			v := *i.ReplacementTimeout
			i.ReplacementTimeout = &v
		}
		c.ISCSI = &i
	}
	return c
}
