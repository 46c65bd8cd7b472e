package driver

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Attacher makes the block device of one volume present on this node and
// takes it away again. There is one Attacher per transport; the driver picks
// it from the "transport" key of the volume context. Implementations must be
// safe for concurrent use on different volumes; the driver never calls two
// methods for the same volume at once.
type Attacher interface {
	// Attach connects every path of the volume and returns its block
	// device, verified to be the volume's (by identity, not by a name
	// glob). Attach is idempotent: a volume already attached returns the
	// same device. On error nothing the call created is left behind.
	Attach(ctx context.Context, req AttachRequest) (Device, error)

	// Detach releases the paths of a staged volume that no other staged
	// volume still needs. Detaching a volume that is not attached is not
	// an error.
	Detach(ctx context.Context, rec volume.Record) error

	// Expand makes the kernel re-read the size of the volume's device
	// (a rescan) and returns the size in bytes the device has now.
	Expand(ctx context.Context, rec volume.Record) (int64, error)

	// Health reports the condition of a staged volume's paths. It reads
	// kernel state only and never repairs anything.
	Health(ctx context.Context, rec volume.Record) Condition
}

// AttachRequest is everything an Attacher needs to attach one volume.
type AttachRequest struct {
	VolumeID string
	Context  volume.Context
	// Secrets are the node-stage secrets; never log or persist them.
	Secrets volume.Secrets
	// ReadOnly is set when every access mode of the capability is
	// read-only.
	ReadOnly bool
}

// Device is an attached, verified block device.
type Device struct {
	// Path of the block device node, e.g. /dev/nvme0n1.
	Path string
	// SizeBytes is the size of the device as the kernel reports it.
	SizeBytes int64
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

// Condition is the health of a staged volume as NodeGetVolumeHealth and
// NodeGetStorageHealth report it.
type Condition struct {
	Status HealthStatus
	// Reason is a short CamelCase cause for machines ("PathsBelowExpected").
	// Empty when Healthy.
	Reason string
	// Message says what is wrong, readable by an operator, e.g. "2 of 3
	// paths live; nvme4 (10.0.0.2:4420) contributes no path".
	Message string
}

// Abnormal reports whether the volume is not Healthy.
func (c Condition) Abnormal() bool { return c.Status != Healthy }

// notBuilt is the Attacher of a transport whose implementation has not been
// wired into this binary. It refuses every attach with FailedPrecondition so
// that no caller ever mistakes it for a success.
type notBuilt struct {
	transport volume.Transport
}

// NotBuilt returns an Attacher that refuses to attach volumes of transport t.
func NotBuilt(t volume.Transport) Attacher { return notBuilt{transport: t} }

func (n notBuilt) err() error {
	return &codedError{
		code: codes.FailedPrecondition,
		msg:  fmt.Sprintf("transport %q is not built into this pathmend binary yet", n.transport),
	}
}

func (n notBuilt) Attach(context.Context, AttachRequest) (Device, error) { return Device{}, n.err() }
func (n notBuilt) Detach(context.Context, volume.Record) error           { return n.err() }
func (n notBuilt) Expand(context.Context, volume.Record) (int64, error)  { return 0, n.err() }
func (n notBuilt) Health(context.Context, volume.Record) Condition {
	return Condition{Status: Inaccessible, Reason: "TransportNotBuilt", Message: n.err().Error()}
}
