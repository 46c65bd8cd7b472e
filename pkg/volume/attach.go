package volume

import (
	"errors"
	"fmt"
)

// AttachRequest is everything a transport needs to attach one volume.
// These attach-side types live here, below every transport and the CSI
// layer, so transports implement the driver's Attacher without importing
// gRPC.
type AttachRequest struct {
	VolumeID string
	Context  Context
	// Secrets are the node-stage secrets; never log or persist them.
	Secrets Secrets
	// ReadOnly is set when every access mode of the capability is
	// read-only.
	ReadOnly bool
	// CoTenants are the other volumes of the volume's target, as the
	// node's intent owner read them under the target's lock: a repair or
	// rollback during the attach never takes what they use, and tears
	// nothing down while CoTenants.Err is set.
	CoTenants CoTenants
}

// Attachment is what one Attach call made present: the verified device,
// and what the call itself created on the host (Created), so that an
// undo removes exactly that and nothing that existed before the call.
type Attachment struct {
	// VolumeID and Context are the request's.
	VolumeID string
	Context  Context
	// Device is the verified block device; zero when the attach failed.
	Device Device
	// Created is what this call created, in its transport's terms; nil
	// when it created nothing (everything existed already).
	Created Created
}

// Created is what one Attach call created on the host — NVMe controllers,
// iSCSI sessions and node records — private to the transport that made it
// and handed back to the same transport's Undo. String names the objects
// for log lines, e.g. "controllers nvme2,nvme3".
type Created interface {
	String() string
}

// ErrUnavailable marks an attach that cannot succeed right now but may
// later without any change of arguments: no path answers, the namespace or
// LUN has not appeared. Transports wrap it; the driver answers Unavailable,
// so the CO retries with backoff.
var ErrUnavailable = errors.New("volume unavailable")

// Device is an attached block device, verified to be the volume's.
type Device struct {
	// Path of the block device node, e.g. /dev/nvme0n1.
	Path string
	// SizeBytes is the size of the device as the kernel reports it.
	SizeBytes int64
	// Number is the device's number from sysfs (block/<dev>/dev); zero
	// when the transport does not read it (the driver then takes it from
	// the device node).
	Number DeviceNumber
}

// HealthStatus grades the paths of a staged volume.
type HealthStatus int

const (
	// Healthy: every expected path is live.
	Healthy HealthStatus = iota
	// Degraded: the volume is usable but runs below its expected paths.
	Degraded
	// Inaccessible: no path to the volume is usable from this node.
	Inaccessible
)

// String names the status for logs.
func (h HealthStatus) String() string {
	switch h {
	case Healthy:
		return "Healthy"
	case Degraded:
		return "Degraded"
	case Inaccessible:
		return "Inaccessible"
	}
	return fmt.Sprintf("HealthStatus(%d)", int(h))
}

// Condition is the health of a staged volume's paths, as
// NodeGetVolumeHealth and NodeGetStorageHealth report it.
type Condition struct {
	Status HealthStatus
	// Reason is a short CamelCase cause for machines
	// ("PathsBelowExpected"). Empty when Healthy.
	Reason string
	// Message says what is wrong, readable by an operator, e.g. "2 of 3
	// paths live; nvme4 (10.0.0.2:4420) contributes no path".
	Message string
	// Devices are the block devices of the volume's namespace or LUN as
	// the transport read them now — the multipath head, or map and disks
	// — with their numbers; empty when it has none. The driver compares
	// them with the device the volume's users hold (Replaced).
	Devices []BlockDevice
}

// Abnormal reports whether the volume is not Healthy.
func (c Condition) Abnormal() bool { return c.Status != Healthy }
