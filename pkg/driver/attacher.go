package driver

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Attacher makes the block device of one volume present on this node and
// takes it away again. There is one Attacher per transport; the driver picks
// it from the "transport" key of the volume context. Implementations keep
// no intent of their own: the driver holds the target's lease of the
// node's intent owner around Attach, Undo and Detach, and passes the
// target's co-tenants in (every other record of the target, and the
// record files that may be the target's but cannot be read). Health and
// Expand run on a staged volume without the lease.
type Attacher interface {
	// Attach connects every path of the volume and returns its block
	// device, verified to be the volume's (by identity, not by a name
	// glob), and what this call created on the host. Attach is
	// idempotent: a volume already attached returns the same device and
	// creates nothing. On error the attachment still names what the call
	// created; the caller removes it with Undo. A repair during the
	// attach spares req.CoTenants and tears nothing down while
	// req.CoTenants.Err is set.
	Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error)

	// Undo removes what one Attach created (a.Created) and nothing that
	// existed before it, sparing what co uses. It returns an error when
	// something it should remove stays (co.Err forbids any teardown, or a
	// teardown failed): the caller then keeps the volume's attaching
	// record, so a later NodeUnstage or the reconciliation finishes it.
	Undo(ctx context.Context, a volume.Attachment, co volume.CoTenants) error

	// Detach releases the paths of a volume that no co-tenant uses. It
	// tears nothing down while co.Err is set. Detaching a volume that is
	// not attached is not an error.
	Detach(ctx context.Context, rec volume.Record, co volume.CoTenants) error

	// Expand makes the kernel re-read the size of the volume's device
	// (a rescan) and returns the size in bytes the device has now.
	Expand(ctx context.Context, rec volume.Record) (int64, error)

	// Health reports the condition of a staged volume's paths. It reads
	// kernel state only and never repairs anything.
	Health(ctx context.Context, rec volume.Record) volume.Condition
}

// DeviceChecker is implemented by an Attacher whose device can change
// between Attach and its first use, when nothing holds it open yet (iSCSI:
// a multipath map assembled late takes the single disk Attach settled
// for). The driver calls CheckDevice just before it formats and mounts
// the device (again when the mount fails) and, for raw block access,
// before it records the volume staged.
type DeviceChecker interface {
	// CheckDevice re-reads the kernel for the device rec names (Device,
	// DevNum) and returns the device to use now: the same one, or the
	// one that has taken its place. An error says the device must not be
	// used now (wrapping volume.ErrUnavailable when a retry may succeed).
	CheckDevice(ctx context.Context, rec volume.Record) (volume.Device, error)
}

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

func (n notBuilt) Attach(_ context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	return volume.Attachment{VolumeID: req.VolumeID, Context: req.Context}, n.err()
}
func (n notBuilt) Undo(context.Context, volume.Attachment, volume.CoTenants) error { return nil }
func (n notBuilt) Detach(context.Context, volume.Record, volume.CoTenants) error   { return n.err() }
func (n notBuilt) Expand(context.Context, volume.Record) (int64, error)            { return 0, n.err() }
func (n notBuilt) Health(context.Context, volume.Record) volume.Condition {
	return volume.Condition{Status: volume.Inaccessible, Reason: "TransportNotBuilt", Message: n.err().Error()}
}
