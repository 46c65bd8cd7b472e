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
// health is the volume's condition as its transport reads it now.
// replaced is true when the volume's staged device was replaced and the
// stage must attach and stage it again. A volume staged on its current
// device, or whose devices cannot be told, is left to the usual in-place
// check (replaced false).
func (d *Driver) clearReplacedStaging(ctx context.Context, rec *volume.Record, health volume.Condition) (replaced bool, err error) {
	c, ok := d.replacedBy(*rec, health)
	if !ok {
		return false, nil
	}
	v, err := d.layers()
	if err != nil {
		return true, err
	}
	var held []string
	for _, p := range rec.Publications {
		if publishedAt(*rec, p, v) {
			held = append(held, p.TargetPath)
		}
	}
	if len(held) > 0 {
		return true, failedPrecondition("volume %s cannot be staged again while it is published at %s: %s", rec.VolumeID, strings.Join(held, ", "), c.Message)
	}
	klog.FromContext(ctx).Info("Restaging a volume whose staged device was replaced", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "reason", c.Message)
	if rec.AccessType != volume.AccessMount {
		return true, nil
	}
	if _, err := d.release(ctx, rec.VolumeID, stagingClaim(*rec)); err != nil {
		return true, err
	}
	// The layer is gone: the record must not name it when the next mount
	// is made at the path, or a crash after that mount would leave a
	// record naming a layer that is not there and a mount it does not
	// name.
	if rec.StagingLayer != nil {
		rec.StagingLayer = nil
		if err := d.deps.Intents.Update(*rec); err != nil {
			return true, internal(err, "record that volume %s is no longer mounted at its staging path", rec.VolumeID)
		}
	}
	return true, nil
}

// clearDamagedStaging is NodeStage's and NodePublish's answer to a staged
// volume whose filesystem takes no writes (read-only after errors) or has
// shut down (pkg/fshealth): nothing remounts it read-write in place, but
// when no publication holds it, its staging mount is unmounted (its layer
// only, by the rule of layers.go), so that the stage checks it
// (fscheck.go) and mounts it again. While a publication holds it, the
// pods using it hold the damaged filesystem too: FailedPrecondition,
// saying they must be restarted. cleared is true when the staging mount
// was unmounted; the record (and rec) then name no staging layer. A
// filesystem that still takes writes (errors recorded, or healthy) is
// left mounted.
func (d *Driver) clearDamagedStaging(ctx context.Context, rec *volume.Record, att Attacher) (cleared bool, err error) {
	mt := d.readMountTable()
	h, ok := d.filesystemHealth(*rec, mt)
	if !ok || (h.State != fshealth.ReadOnly && h.State != fshealth.Shutdown) {
		return false, nil
	}
	v, err := d.layers()
	if err != nil {
		return false, err
	}
	var held []string
	for _, p := range rec.Publications {
		if publishedAt(*rec, p, v) {
			held = append(held, p.TargetPath)
		}
	}
	if len(held) > 0 {
		return false, failedPrecondition("volume %s cannot be checked and mounted again while it is published at %s: %s", rec.VolumeID, strings.Join(held, ", "), h.Condition().Message)
	}
	// Its unmount writes the superblock: not started with no live path.
	if err := d.stallCheck(*rec, d.pathsNow(ctx, *rec, att), mt, rec.StagingPath, "an unmount"); err != nil {
		return false, err
	}
	klog.FromContext(ctx).Info("Unmounting a staged filesystem that takes no writes, to check it and mount it again", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "filesystem", h.Summary())
	if _, err := d.release(ctx, rec.VolumeID, stagingClaim(*rec)); err != nil {
		return false, err
	}
	if rec.StagingLayer != nil {
		rec.StagingLayer = nil
		if err := d.deps.Intents.Update(*rec); err != nil {
			return true, internal(err, "record that volume %s is no longer mounted at its staging path", rec.VolumeID)
		}
	}
	return true, nil
}

// remountDamaged checks and mounts again, in place, the staged filesystem
// of rec when it takes no writes and no publication holds it (NodePublish
// of a volume whose last pod left it damaged: kubelet keeps the volume
// staged for the next pod and sends no NodeStage). The new staging layer
// is recorded, in rec too; remounted says whether it happened.
func (d *Driver) remountDamaged(ctx context.Context, rec *volume.Record, att Attacher) (remounted bool, err error) {
	if rec.AccessType != volume.AccessMount {
		return false, nil
	}
	cleared, err := d.clearDamagedStaging(ctx, rec, att)
	if err != nil || !cleared {
		return false, err
	}
	made, err := d.mountStaging(ctx, rec, nil, true)
	if err != nil {
		if made != nil {
			if uerr := d.unmountLayer(ctx, rec.VolumeID, *made); uerr != nil {
				klog.FromContext(ctx).Error(uerr, "Unmount of the failed remount's staging mount failed; the record names its layer", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath)
			}
		}
		return false, err
	}
	if err := d.deps.Intents.Update(*rec); err != nil {
		return true, internal(err, "record the staging layer of volume %s", rec.VolumeID)
	}
	klog.FromContext(ctx).Info("Checked and mounted again a staged filesystem that took no writes", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "device", rec.Device)
	return true, nil
}
