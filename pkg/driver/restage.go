package driver

import (
	"context"
	"strings"

	"k8s.io/klog/v2"

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
	if _, err := d.release(rec.VolumeID, stagingClaim(*rec)); err != nil {
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
