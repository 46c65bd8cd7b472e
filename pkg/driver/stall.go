package driver

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Every path down: decide before starting, not after.
//
// With pathmend's connect options (ctrl_loss_tmo off, fast_io_fail_tmo
// 600 s) and with dm-multipath's no_path_retry, the kernel queues a
// volume's I/O while no path is live. A call that writes to the device
// then waits in the kernel, uncancellable, until a path returns or the
// kernel gives the queued I/O up: an unmount of a read-write ext4 or XFS
// writes its superblock or log even when no data is dirty (measured on
// Linux 6.1: an unmount of a clean, synced ext4 and of a clean XFS each
// waited until the ports returned; a read-only ext4's unmount and the
// unmount of a bind mount whose filesystem stays mounted elsewhere
// returned at once, and so did the unmount of an XFS that had shut down;
// an ext4 read-only after an error still waited, writing its superblock).
// So the decision is made from the paths' state before
// anything is started: a call that would write to a read-write filesystem
// (or, for a block volume, open its device) is not started while no path
// of the volume is live and the kernel still has its device. The answer
// is Unavailable within the time of a few sysfs reads, naming the
// volume's state and what the kernel reports of its unwritten data.
// Unwritten data does not change the decision (a clean filesystem waits
// too); it says what a retry after the paths return will save, and what
// giving up would lose (docs/operations.md#every-path-of-a-volume-is-down).
//
// A device the kernel no longer has (its last path given up, an NVMe head
// removed) fails every I/O at once: an unmount of a filesystem on it
// returns, and is started.

// stallCheck returns an Unavailable error when op (a call that writes to
// rec's filesystem or opens its device: "an unmount", "a statfs") would
// wait in the kernel for a path now: c, the volume's paths as its
// transport read them, has no live path, the kernel still has the
// device, and the filesystem mounted at mountPoint (none for a block
// volume) is read-write in mt, the mount table. It returns nil when op
// would not wait, or when nothing is mounted at mountPoint. It starts
// nothing that can block: it reads sysfs, and the kernel's counters of
// unwritten data for the message.
func (d *Driver) stallCheck(rec volume.Record, c volume.Condition, mt mountTable, mountPoint, op string) error {
	var mi *mount.MountInfo
	num := rec.DevNum
	if mountPoint != "" {
		if mt.err != nil {
			return internal(mt.err, "read the mount table")
		}
		m, ok := fshealth.MountAt(mountPoint, mt.infos)
		if !ok {
			return nil // nothing mounted: nothing to write
		}
		if slices.Contains(m.SuperOptions, "ro") {
			return nil // a read-only superblock writes nothing at unmount
		}
		if d.deps.Filesystems.ShutDown(m.FsType, m.MountPoint) {
			return nil // a shut-down XFS writes nothing either
		}
		mi = &m
		num = volume.DeviceNumber{Major: uint32(m.Major), Minor: uint32(m.Minor)}
	}
	if !num.IsZero() {
		// sysfs lists every block device the kernel has under dev/block.
		if _, err := d.deps.SysFS.Stat("dev/block/" + num.String()); err != nil {
			return nil // removed: every I/O to it fails at once
		}
	}
	if c.Status != volume.Inaccessible {
		return nil // a live path carries the I/O
	}
	return &codedError{code: codes.Unavailable, msg: d.stallMessage(rec, mi, c, op)}
}

// stallCheckNow is stallCheck with the paths and the mount table read now.
func (d *Driver) stallCheckNow(ctx context.Context, rec volume.Record, att Attacher, mountPoint, op string) error {
	return d.stallCheck(rec, att.Health(ctx, rec), d.readMountTable(), mountPoint, op)
}

// stallMessage says why op was not started: the paths, the filesystem,
// its unwritten data, until when the kernel queues, and what to do.
func (d *Driver) stallMessage(rec volume.Record, mi *mount.MountInfo, c volume.Condition, op string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "volume %s: no path is live (%s)", rec.VolumeID, c.Message)
	if mi != nil {
		dev, _ := d.deps.Filesystems.DeviceName(volume.DeviceNumber{Major: uint32(mi.Major), Minor: uint32(mi.Minor)}, mi.Source)
		fmt.Fprintf(&b, "; %s on %s (%d:%d) is mounted read-write at %s", mi.FsType, dev, mi.Major, mi.Minor, mi.MountPoint)
		if u := d.deps.Filesystems.Unwritten(mi.FsType, dev, mi.MountPoint).String(); u != "" {
			fmt.Fprintf(&b, " (%s)", u)
		}
		fmt.Fprintf(&b, ": %s would wait in the kernel, writing to a device that takes no writes,", op)
	} else {
		fmt.Fprintf(&b, ": %s would wait in the kernel for the device's I/O", op)
	}
	fmt.Fprintf(&b, " until a path returns or the kernel gives the queued I/O up (%s). Nothing was started; the call succeeds on a retry once a path is live again (pathmend reconnects it), with nothing written lost. If the storage is gone for good, see docs/operations.md#every-path-of-a-volume-is-down to give the unwritten data up deliberately", queueBound(rec.Context))
	return boundMessage(b.String(), maxErrorMessageBytes)
}

// maxErrorMessageBytes bounds the message of an RPC error built from
// kernel state: kubelet logs it and puts it in events.
const maxErrorMessageBytes = 2048

// queueBound says what ends the kernel's queueing for a volume of c's
// transport.
func queueBound(c volume.Context) string {
	switch {
	case c.NVMe != nil && c.NVMe.FastIOFailTmo != nil && *c.NVMe.FastIOFailTmo < 0:
		return "never: fastIOFailTmo is off, so NVMe I/O queues until a path returns"
	case c.NVMe != nil && c.NVMe.FastIOFailTmo != nil:
		return fmt.Sprintf("NVMe fast_io_fail_tmo, %d s after the paths went down", *c.NVMe.FastIOFailTmo)
	case c.NVMe != nil:
		return "NVMe fast_io_fail_tmo after the paths went down: pathmend's default unless the volume context sets fastIOFailTmo"
	case c.ISCSI != nil:
		return "the multipath map's no_path_retry, or on a single path the session's replacement_timeout"
	}
	return "the transport's queueing timeout"
}
