package driver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/model"
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
// returns, and is started. So does one on an NVMe namespace whose every
// controller's fast_io_fail_tmo has run out (counted from the model's
// Since of each down path, plus a health bound): the kernel fails its
// I/O at once then, and what was queued is lost already. The message
// says when that will be.

// volumePaths is what the stall decision knows of a volume's paths: their
// condition (the transport's read of the volume's own kernel objects, or
// the node model's entry within its bound) and the model's paths, each
// with since when the loop has seen it in its state (none when the model
// has no entry of the volume).
type volumePaths struct {
	cond  volume.Condition
	model []model.Path
}

// noneLive reports whether no path of the volume carries I/O.
func (p volumePaths) noneLive() bool {
	return p.cond.Status == volume.Inaccessible && p.cond.Reason != reasonNotMounted && p.cond.Reason != volume.ReasonStagedDeviceReplaced
}

// downSince is when the last of the volume's paths went down, as the loop
// saw it: the latest Since of the model's paths when none of them is
// live. Zero when the model has no paths of the volume or still sees one
// live (it went down less than a tick ago).
func (p volumePaths) downSince() time.Time {
	var since time.Time
	for _, mp := range p.model {
		if mp.State == model.PathLive {
			return time.Time{}
		}
		if mp.Since.After(since) {
			since = mp.Since
		}
	}
	return since
}

// queueing says until when the kernel queues a volume's I/O while no path
// is live, as far as pathmend can tell.
type queueing struct {
	// until is when the last queue gives up; zero when unknown or never.
	until time.Time
	// never is set when a queue waits for a path whatever the time
	// (NVMe fast_io_fail_tmo off).
	never bool
	// words say it for a message: "NVMe fast_io_fail_tmo (600 s) expires
	// at 2026-12-04T18:10:00Z".
	words string
}

// queueEnd reads until when the kernel queues rec's I/O with no path.
// NVMe: each down controller fails its queued I/O fast_io_fail_tmo after
// it began reconnecting (class/nvme/<ctrl>/fast_io_fail_tmo; the kernel
// publishes no time of the state change, so the model's Since stands for
// it, which is never earlier than the truth); the namespace's I/O waits
// while any controller still queues. iSCSI: multipath's no_path_retry or
// the session's replacement_timeout, neither of which the kernel
// publishes a time for.
func (d *Driver) queueEnd(rec volume.Record, p volumePaths) queueing {
	if rec.Context.NVMe == nil {
		if rec.Context.ISCSI != nil {
			return queueing{words: "the multipath map's no_path_retry runs out (or, on a single path, the session's replacement_timeout)"}
		}
		return queueing{words: "the transport's queueing timeout ends"}
	}
	var q queueing
	tmo := map[int64]bool{}
	for _, mp := range p.model {
		if mp.State != model.PathDown || mp.Object == "" || mp.Since.IsZero() {
			continue // no controller queues for an absent path
		}
		v, err := d.deps.SysFS.ReadAttr("class/nvme/" + mp.Object + "/fast_io_fail_tmo")
		if err != nil {
			return queueing{words: "NVMe fast_io_fail_tmo expires (" + err.Error() + ")"}
		}
		if v == "off" {
			return queueing{never: true, words: "never: fast_io_fail_tmo is off on " + mp.Object + ", so its I/O queues until a path returns"}
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return queueing{words: fmt.Sprintf("NVMe fast_io_fail_tmo expires (%s reads %q)", mp.Object, v)}
		}
		tmo[n] = true
		if end := mp.Since.Add(time.Duration(n) * time.Second); end.After(q.until) {
			q.until = end
		}
	}
	if q.until.IsZero() {
		return queueing{words: "NVMe fast_io_fail_tmo expires, counted from when each controller began reconnecting"}
	}
	secs := make([]string, 0, len(tmo))
	for _, n := range slices.Sorted(maps.Keys(tmo)) {
		secs = append(secs, strconv.FormatInt(n, 10))
	}
	q.words = fmt.Sprintf("NVMe fast_io_fail_tmo (%s s) expires at %s", strings.Join(secs, ", "), q.until.UTC().Format(time.RFC3339))
	return q
}

// stallCheck returns an Unavailable error when op (a call that writes to
// rec's filesystem or opens its device: "an unmount", "a statfs") would
// wait in the kernel for a path now: no path of the volume is live (p),
// the kernel still has the device and still queues its I/O, and the
// filesystem mounted at mountPoint (none for a block volume) is
// read-write in mt, the mount table. It returns nil when op would not
// wait, or when nothing is mounted at mountPoint. It starts nothing that
// can block: it reads sysfs, and the kernel's counters of unwritten data
// for the message.
func (d *Driver) stallCheck(rec volume.Record, p volumePaths, mt mountTable, mountPoint, op string) error {
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
		if d.deps.Filesystems != nil && d.deps.Filesystems.ShutDown(m.FsType, m.MountPoint) {
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
	if !p.noneLive() {
		return nil // a live path carries the I/O
	}
	q := d.queueEnd(rec, p)
	now := d.deps.Clock.Now()
	// Past the end of every queue the kernel fails the I/O at once: the
	// call returns, with what was queued lost already. The end is taken
	// a health bound late, so that a path that came and went between two
	// ticks (which the model may not have seen) cannot make it early.
	if !q.until.IsZero() && now.After(q.until.Add(d.cfg.HealthBound)) {
		klog.InfoS("No path is live, but the kernel no longer queues the volume's I/O: starting the call", "volumeID", rec.VolumeID, "call", op, "queueingEnded", q.until.UTC().Format(time.RFC3339), "paths", p.cond.Message)
		return nil
	}
	return &codedError{code: codes.Unavailable, msg: d.stallMessage(rec, mi, p, q, op)}
}

// stallCheckNow is stallCheck with the volume's paths read now (its own
// kernel objects), the model's entry for since when, and the mount table
// read now.
func (d *Driver) stallCheckNow(ctx context.Context, rec volume.Record, att Attacher, mountPoint, op string) error {
	return d.stallCheck(rec, d.pathsNow(ctx, rec, att), d.readMountTable(), mountPoint, op)
}

// pathsNow reads the volume's paths through its transport (its own kernel
// objects only) and takes the model's paths for since when.
func (d *Driver) pathsNow(ctx context.Context, rec volume.Record, att Attacher) volumePaths {
	e, _ := d.modelEntry(rec)
	return volumePaths{cond: att.Health(ctx, rec), model: e.Paths}
}

// stallMessage says why op was not started: since when every path is
// down, the paths, the filesystem, its unwritten data, until when the
// kernel queues, and what to do.
func (d *Driver) stallMessage(rec volume.Record, mi *mount.MountInfo, p volumePaths, q queueing, op string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "volume %s: every path is down", rec.VolumeID)
	if since := p.downSince(); !since.IsZero() {
		fmt.Fprintf(&b, " since %s (%s ago)", since.UTC().Format(time.RFC3339), d.deps.Clock.Since(since).Round(time.Second))
	} else {
		b.WriteString(" (since less than a monitor tick ago)")
	}
	fmt.Fprintf(&b, " (%s)", p.cond.Message)
	if mi != nil {
		dev, _ := d.deps.Filesystems.DeviceName(volume.DeviceNumber{Major: uint32(mi.Major), Minor: uint32(mi.Minor)}, mi.Source)
		fmt.Fprintf(&b, "; %s on %s (%d:%d) is mounted read-write at %s", mi.FsType, dev, mi.Major, mi.Minor, mi.MountPoint)
		if u := d.deps.Filesystems.Unwritten(mi.FsType, dev, mi.MountPoint).String(); u != "" {
			fmt.Fprintf(&b, " with %s", u)
		}
		fmt.Fprintf(&b, ": %s would wait in the kernel, writing to a device that takes no writes,", op)
	} else {
		fmt.Fprintf(&b, ": %s would wait in the kernel for the device's I/O", op)
	}
	if q.never {
		fmt.Fprintf(&b, " until a path returns (%s)", q.words)
	} else {
		fmt.Fprintf(&b, " until a path returns or %s", q.words)
	}
	b.WriteString(". Nothing was started; the call succeeds on a retry once a path is live again (pathmend reconnects it), with nothing written lost. If the storage is gone for good, see docs/operations.md#every-path-of-a-volume-is-down to give the unwritten data up deliberately")
	return boundMessage(b.String(), maxErrorMessageBytes)
}

// maxErrorMessageBytes bounds the message of an RPC error built from
// kernel state: kubelet logs it and puts it in events.
const maxErrorMessageBytes = 2048
