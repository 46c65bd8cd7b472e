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

// The attach-side types are defined in pkg/volume so that transports
// implement Attacher without importing this gRPC-facing package.
type (
	// AttachRequest is everything an Attacher needs to attach one volume.
	AttachRequest = volume.AttachRequest
	// Device is an attached, verified block device.
	Device = volume.Device
	// Condition is the path health of a staged volume.
	Condition = volume.Condition
	// HealthStatus grades a volume's paths.
	HealthStatus = volume.HealthStatus
)

// Health statuses, re-exported for callers of this package.
const (
	Healthy      = volume.Healthy
	Degraded     = volume.Degraded
	Inaccessible = volume.Inaccessible
)

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
