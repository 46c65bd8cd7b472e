package driver

import (
	"context"
	"strings"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/volume"
)

// clearReplacedStaging is NodeStage's answer to a recorded volume whose
// staged device the kernel replaced (see staged_device.go). NodeStage
// must not answer AlreadyExists about the volume's own dead mount:
//
//   - when no publication holds the old mount, it unmounts the staging
//     path (every layer), so that the stage goes on to attach and mount
//     the volume's current device; the data on the volume is intact and
//     the filesystem replays its journal at the mount;
//   - when a publication still holds it, the pods using the volume hold
//     the dead filesystem too: it answers FailedPrecondition, saying the
//     pods must be restarted (their unpublish, then the unstage, let the
//     next stage mount the new device).
//
// replaced is true when the volume's staged device was replaced and the
// stage must attach and stage it again. A volume staged on its current
// device, or whose devices cannot be told, is left to the usual in-place
// check (replaced false).
func (d *Driver) clearReplacedStaging(ctx context.Context, rec volume.Record, att Attacher) (replaced bool, err error) {
	c, ok := d.replaced(ctx, rec, att)
	if !ok {
		return false, nil
	}
	var held []string
	for _, p := range rec.Publications {
		if mounted, _ := isMountPoint(d.deps.Mounter, p.TargetPath); mounted {
			held = append(held, p.TargetPath)
		}
	}
	if len(held) > 0 {
		return true, failedPrecondition("volume %s cannot be staged again while it is published at %s: %s", rec.VolumeID, strings.Join(held, ", "), c.Message)
	}
	klog.InfoS("Restaging a volume whose staged device was replaced", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "reason", c.Message)
	if rec.AccessType == volume.AccessMount {
		return true, d.unmountAll(ctx, rec.VolumeID, rec.StagingPath)
	}
	return true, nil
}

// sameDevice reports whether the mount at path is of device: by device
// number when both are known — the mount's in the mount table, the
// device node's — else by path with symlinks resolved. known is false
// when path has no mount.
func (d *Driver) sameDevice(path, device string) (same, known bool, err error) {
	mounts, err := d.mounts()
	if err != nil {
		return false, false, err
	}
	rec := volume.Record{AccessType: volume.AccessMount, StagingPath: path}
	staged, ok := stagedDevice(rec, mounts)
	if !ok {
		return false, false, nil
	}
	if n, ok := rdevOf(device); ok {
		return n == staged.Device.Number, true, nil
	}
	return false, false, nil
}

// clearDamagedStaging is NodeStage's and NodePublish's answer to a staged
// volume whose filesystem takes no writes (read-only after errors) or has
// shut down (pkg/fshealth): nothing remounts it read-write in place, but
// when no publication holds it, it is unmounted, so that the stage checks
// it (fscheck.go) and mounts it again. While a publication holds it, the
// pods using it hold the damaged filesystem too: FailedPrecondition,
// saying they must be restarted. cleared is true when the staging path was
// unmounted. A filesystem that still takes writes (errors recorded, or
// healthy) is left mounted.
func (d *Driver) clearDamagedStaging(ctx context.Context, rec volume.Record, att Attacher) (cleared bool, err error) {
	mt := d.readMountTable()
	h, ok := d.filesystemHealth(rec, mt)
	if !ok || (h.State != fshealth.ReadOnly && h.State != fshealth.Shutdown) {
		return false, nil
	}
	var held []string
	for _, p := range rec.Publications {
		if mounted, _ := isMountPoint(d.deps.Mounter, p.TargetPath); mounted {
			held = append(held, p.TargetPath)
		}
	}
	if len(held) > 0 {
		return false, failedPrecondition("volume %s cannot be checked and mounted again while it is published at %s: %s", rec.VolumeID, strings.Join(held, ", "), h.Condition().Message)
	}
	// Its unmount writes the superblock: not started with no live path.
	if err := d.stallCheck(rec, d.pathsNow(ctx, rec, att), mt, rec.StagingPath, "an unmount"); err != nil {
		return false, err
	}
	klog.InfoS("Unmounting a staged filesystem that takes no writes, to check it and mount it again", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "filesystem", h.Summary())
	if err := d.unmountAll(ctx, rec.VolumeID, rec.StagingPath); err != nil {
		return false, err
	}
	return true, nil
}

// remountDamaged checks and mounts again, in place, the staged filesystem
// of rec when it takes no writes and no publication holds it (NodePublish
// of a volume whose last pod left it damaged: kubelet keeps the volume
// staged for the next pod and sends no NodeStage).
func (d *Driver) remountDamaged(ctx context.Context, rec volume.Record, att Attacher) error {
	if rec.AccessType != volume.AccessMount {
		return nil
	}
	cleared, err := d.clearDamagedStaging(ctx, rec, att)
	if err != nil || !cleared {
		return err
	}
	if _, err := d.mountStaging(rec); err != nil {
		return err
	}
	klog.InfoS("Checked and mounted again a staged filesystem that took no writes", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "device", rec.Device)
	return nil
}
