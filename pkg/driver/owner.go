package driver

import (
	"context"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Unmount only what is ours (layers.go has the rule). NodeUnpublishVolume
// and NodeUnstageVolume take a path from the caller:
//
//   - at a path the volume's record does not name, pathmend made
//     nothing: a mount there is refused with FailedPrecondition naming it
//     and left alone, and a path with nothing mounted is left alone and
//     the call succeeds, as csi-sanity and kubelet's retries expect;
//   - at a recorded path, the volume's layers are unmounted, top first,
//     when nothing else stands at, on, under, inside or over them;
//     otherwise nothing is unmounted and nothing removed;
//   - a target path is removed only when NodePublish created it and it
//     is empty; a staging path is kubelet's and never removed.

// unpublish undoes the publication of a volume at target.
func (d *Driver) unpublish(ctx context.Context, volumeID string, rec volume.Record, hasRecord bool, target string) error {
	logger := klog.FromContext(ctx)
	idx := -1
	if hasRecord {
		idx = slices.IndexFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == target })
	}
	if idx < 0 {
		v, err := d.layers()
		if err != nil {
			return err
		}
		c := unclaimed("target path", target)
		if s := c.inspect(v); s.foreign != nil {
			return failedPrecondition("target path %s is not a publication of volume %s and holds a mount: %s; it is left alone", quoteShort(target), volumeID, s.foreign)
		}
		logger.V(2).Info("Unpublish of a path that holds no publication of the volume: nothing to do", "volumeID", volumeID, "targetPath", target)
		return nil
	}
	p := rec.Publications[idx]
	v, err := d.layers()
	if err != nil {
		return err
	}
	n, err := d.release(ctx, volumeID, publicationClaim(rec, p, v))
	if err != nil {
		return err
	}
	if p.Created {
		if err := removeCreated(target); err != nil {
			return err
		}
	}
	logger.V(4).Info("Released publication", "volumeID", volumeID, "targetPath", target, "unmounted", n, "removed", p.Created)
	return nil
}

// unstageUnrecorded answers a NodeUnstageVolume of a volume without a
// record: with nothing mounted at the staging path there is nothing to do;
// a mount there is not known to be pathmend's and is left alone.
func (d *Driver) unstageUnrecorded(ctx context.Context, volumeID, staging string) error {
	v, err := d.layers()
	if err != nil {
		return err
	}
	if s := unclaimed("staging path", staging).inspect(v); s.foreign != nil {
		return failedPrecondition("volume %s has no staged-volume record on this node; the mount at staging path %s (%s) is not known to be its and is left alone", volumeID, quoteShort(staging), s.foreign)
	}
	klog.FromContext(ctx).V(2).Info("Unstage of a volume with no record: nothing to detach", "volumeID", volumeID, "stagingPath", staging)
	return nil
}
