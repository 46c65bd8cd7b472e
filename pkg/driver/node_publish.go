package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// NodePublishVolume bind-mounts a staged volume at the target path: the
// staging mount for filesystem access, the block device onto a file for
// block access. Publishing again the same way is OK.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	volumeID := req.GetVolumeId()
	target, err := volumeAndPath(volumeID, "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	vc, err := parseCapability(req.GetVolumeCapability(), d.cfg.DefaultFSType)
	if err != nil {
		return nil, err
	}
	// The spec's error table: a plugin with STAGE_UNSTAGE_VOLUME answers a
	// publish without a staging path FailedPrecondition (stage first).
	if req.GetStagingTargetPath() == "" {
		return nil, failedPrecondition("staging_target_path is required: volume %s must be staged (NodeStageVolume) before it is published", volumeID)
	}
	staging, err := checkPath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	// A target is a place of its own: never the staging path, inside it
	// or around it (a bind over an ancestor of the staging path would
	// hide the staging mount and everything beside it).
	if how := relation(target, staging); how != "" {
		return nil, invalidArgument("target_path %s %s the staging path of volume %s", quoteShort(target), how, volumeID)
	}
	given, err := publishedContext(req.GetVolumeContext(), req.GetPublishContext())
	if err != nil {
		return nil, err
	}
	release, err := d.locks.acquire(volumeID)
	if err != nil {
		return nil, err
	}
	defer release()

	rec, err := d.deps.Intents.Get(volumeID)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return nil, failedPrecondition("volume %s is not staged on this node", volumeID)
	case err != nil:
		return nil, internal(err, "read record of volume %s", volumeID)
	case rec.State != volume.StateStaged:
		return nil, failedPrecondition("volume %s is not staged on this node: its record is %s", volumeID, rec.State)
	}
	if rec.StagingPath != staging {
		return nil, failedPrecondition("volume %s is staged at %s, not %s", volumeID, rec.StagingPath, staging)
	}
	if given != nil && !given.Equal(rec.Context) {
		return nil, failedPrecondition("volume %s is staged with another volume context than this publish request carries", volumeID)
	}
	if rec.AccessType != vc.access {
		return nil, invalidArgument("volume_capability: volume %s is staged for %s access, not %s", volumeID, rec.AccessType, vc.access)
	}
	readOnly := req.GetReadonly() || vc.readOnly
	logger := klog.FromContext(ctx)

	v, err := d.layers()
	if err != nil {
		return nil, err
	}
	idx := slices.IndexFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == target })
	tc := unclaimed("target path", target)
	if idx >= 0 {
		tc = publicationClaim(rec, rec.Publications[idx], v)
	}
	ts := tc.inspect(v)
	if ts.foreign != nil {
		return nil, foreignError(volumeID, tc, ts)
	}
	if top, ok := ts.top(); ok {
		// Every layer there is the volume's publication.
		if rec.Publications[idx].ReadOnly != readOnly {
			return nil, alreadyExists("volume %s is published at %s with readonly=%t, not %t", volumeID, target, rec.Publications[idx].ReadOnly, readOnly)
		}
		if !tc.exact(v, top) {
			// Made before a crash, before a restart in a new mount
			// namespace, or by a pathmend that kept no layers: record it.
			rec.Publications[idx].Layer = ptr(top.Record(v.ns))
			if err := d.deps.Intents.Update(rec); err != nil {
				return nil, internal(err, "record the publication layer of volume %s", volumeID)
			}
		}
		logger.V(4).Info("Volume already published", "volumeID", volumeID, "targetPath", target)
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if rec.AccessType == volume.AccessMount {
		// The bind shows what is on top of the staging path: it must be
		// the volume's filesystem.
		sc := stagingClaim(rec)
		ss := sc.inspect(v)
		if ss.foreign != nil {
			return nil, foreignError(volumeID, sc, ss)
		}
		if len(ss.stack) == 0 {
			return nil, failedPrecondition("volume %s is not mounted at its staging path %s: stage it again (NodeStageVolume)", volumeID, quoteShort(staging))
		}
	}
	if vc.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		for _, p := range rec.Publications {
			if p.TargetPath != target && publishedAt(rec, p, v) {
				return nil, failedPrecondition("volume %s has a single-writer access mode and is already published at %s", volumeID, p.TargetPath)
			}
		}
	}
	// A filesystem that takes no writes is checked and mounted again
	// before a pod gets it, when no other pod holds it; while one does,
	// this publish fails saying so.
	if att, err := d.attacher(rec.Context.Transport); err == nil {
		remounted, err := d.remountDamaged(ctx, &rec, att)
		if err != nil {
			return nil, err
		}
		if remounted {
			if v, err = d.layers(); err != nil {
				return nil, err
			}
		}
	}
	if idx < 0 && len(rec.Publications) >= volume.MaxPublications {
		return nil, resourceExhausted("volume %s is published at %d target paths, the most one volume may have on a node", volumeID, len(rec.Publications))
	}
	exists, err := emptyPlace(v, "target_path", target, rec.AccessType == volume.AccessMount)
	if err != nil {
		return nil, err
	}
	if err := d.checkContainingMount(v, "target_path", target); err != nil {
		return nil, err
	}
	if exists && idx < 0 {
		// A target kubelet did not leave for this volume: never another
		// volume's staging path or publication (off the common path:
		// kubelet creates only the target's parent).
		if err := d.checkNotVolumePath("target_path", target, canonical(target), "is"); err != nil {
			return nil, err
		}
	}

	// The publication is recorded before the bind mount, as every intent
	// is, with the layer the bind will show: a crash between the two
	// leaves a record naming the target path and what is the volume's
	// there, so a retried NodePublish finds it mounted and NodeUnpublish
	// releases it. A mount recorded nowhere would be refused as someone
	// else's by both, for ever.
	pending, ok := pendingBind(rec, v)
	if !ok {
		return nil, internal(nil, "the mount table has no mount for the source of volume %s's bind", volumeID)
	}
	prev := slices.Clone(rec.Publications)
	pub := volume.Publication{TargetPath: target, ReadOnly: readOnly, Created: !exists, Layer: pending}
	if idx >= 0 {
		pub.Created = rec.Publications[idx].Created || !exists
		rec.Publications[idx] = pub
	} else {
		idx = len(rec.Publications)
		rec.Publications = append(rec.Publications, pub)
	}
	if err := d.deps.Intents.Update(rec); err != nil {
		return nil, internal(err, "record publication of volume %s", volumeID)
	}
	forget := func(cause error) error {
		rec.Publications = prev
		if uerr := d.deps.Intents.Update(rec); uerr != nil {
			logger.Error(uerr, "Rollback: forget the publication failed; NodeUnpublishVolume forgets it", "volumeID", volumeID, "targetPath", target)
		}
		return cause
	}
	if err := d.makeTarget(rec, target, exists); err != nil {
		return nil, forget(err)
	}
	undoTarget := func() {
		if !exists {
			if err := removeCreated(target); err != nil {
				logger.Error(err, "Rollback: remove the target path failed", "volumeID", volumeID, "targetPath", target)
			}
		}
	}
	if err := d.bindTarget(rec, target, readOnly, vc.mountFlags); err != nil {
		// A bind can fail after it mounted (mount-utils binds, then
		// remounts read-only): undo whatever it left.
		return nil, d.undoPublish(ctx, rec, idx, v, forget, undoTarget, err)
	}
	// The layer the bind made is recorded; until it is, the publication
	// is recognised by what it looks like.
	after, err := d.layers()
	if err != nil {
		return nil, d.undoPublish(ctx, rec, idx, v, forget, undoTarget, err)
	}
	pc := publicationClaim(rec, rec.Publications[idx], after)
	l, isNew, _ := newTop(v, after, pc, "")
	if !isNew || !pc.ours(after, l) {
		cause := internal(nil, "after the bind mount, the top of target path %s is not the bind of volume %s", quoteShort(target), volumeID)
		if rec.AccessType == volume.AccessMount {
			// Someone mounted on the staging path between the check and
			// the bind: the bind shows their filesystem.
			sc := stagingClaim(rec)
			if ss := sc.inspect(after); ss.foreign != nil {
				cause = foreignError(volumeID, sc, ss)
			}
		}
		return nil, d.undoPublish(ctx, rec, idx, v, forget, undoTarget, cause)
	}
	rec.Publications[idx].Layer = ptr(l.Record(after.ns))
	if err := d.deps.Intents.Update(rec); err != nil {
		return nil, d.undoPublish(ctx, rec, idx, v, forget, undoTarget, internal(err, "record the publication layer of volume %s", volumeID))
	}
	logger.V(2).Info("Published volume", "volumeID", volumeID, "targetPath", target, "readOnly", readOnly, "accessType", rec.AccessType, "mount", l.ID)
	return &csi.NodePublishVolumeResponse{}, nil
}

// undoPublish undoes the bind of a publication after a later step of
// NodePublish failed: it unmounts the bind this call made (the layer the
// mount table shows on top of the target that was not there before, when
// it is the volume's), removes the target path it created and forgets the
// publication. When the bind cannot be told or unmounted, the publication
// stays recorded, so NodeUnpublish releases it.
func (d *Driver) undoPublish(ctx context.Context, rec volume.Record, idx int, before layerView, forget func(error) error, undoTarget func(), cause error) error {
	logger := klog.FromContext(ctx)
	p := rec.Publications[idx]
	after, err := d.layers()
	if err != nil {
		logger.Error(err, "Rollback: cannot read the mount table; the publication stays recorded", "volumeID", rec.VolumeID, "targetPath", p.TargetPath)
		return cause
	}
	c := publicationClaim(rec, p, after)
	source := ""
	if p.Layer != nil {
		source = p.Layer.Source
	}
	l, isNew, made := newTop(before, after, c, source)
	if isNew && !made {
		// The bind shows what is on top of its source now, even when
		// that is not the volume's (a mount made on the staging path
		// between the check and the bind): it is still this call's.
		if now, ok := pendingBind(rec, after); ok && shaped(l, *now) && l.Source == now.Source {
			made = true
		}
	}
	if isNew && made {
		if err := d.deps.UnmountLayer(l); err != nil {
			logger.Error(err, "Rollback: unmount the bind failed; the publication stays recorded", "volumeID", rec.VolumeID, "targetPath", p.TargetPath)
			return cause
		}
	} else if len(after.tb.Stack(c.path)) > len(before.tb.Stack(c.path)) {
		logger.Error(nil, "Rollback: the mount on top of the target is not the bind this call made; the publication stays recorded", "volumeID", rec.VolumeID, "targetPath", p.TargetPath)
		return cause
	}
	undoTarget()
	return forget(cause)
}

// makeTarget creates the target path when it does not exist: a directory
// for filesystem access, a file (in a directory) the device node is bound
// onto for block access; kubelet creates only the target's parent.
func (d *Driver) makeTarget(rec volume.Record, target string, exists bool) error {
	if exists {
		return nil
	}
	if rec.AccessType == volume.AccessBlock {
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return internal(err, "create parent of %s", target)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o640)
		if err != nil {
			return internal(err, "create block target file %s", target)
		}
		_ = f.Close()
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return internal(err, "create parent of %s", target)
	}
	if err := os.Mkdir(target, 0o750); err != nil {
		return internal(err, "create target directory %s", target)
	}
	return nil
}

// bindTarget makes the bind mount of a publication.
func (d *Driver) bindTarget(rec volume.Record, target string, readOnly bool, flags []string) error {
	opts := append([]string{"bind"}, flags...)
	if readOnly {
		opts = append(opts, "ro")
	}
	source := rec.StagingPath
	if rec.AccessType == volume.AccessBlock {
		source = rec.Device
	}
	if err := d.deps.Mounter.Mount(source, target, "", opts); err != nil {
		return internal(err, "bind mount %s at %s", source, target)
	}
	return nil
}

// NodeUnpublishVolume unmounts the volume's publication at the target path
// and removes the path when NodePublish created it (see owner.go); a mount
// of anything else there is FailedPrecondition and left alone, with
// everything under it. A target with nothing mounted is OK.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	volumeID := req.GetVolumeId()
	target, err := volumeAndPath(volumeID, "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	release, err := d.locks.acquire(volumeID)
	if err != nil {
		return nil, err
	}
	defer release()

	rec, err := d.deps.Intents.Get(volumeID)
	hasRecord := err == nil
	if err != nil && !errors.Is(err, volume.ErrNotFound) {
		return nil, internal(err, "read record of volume %s", volumeID)
	}
	if hasRecord {
		if err := d.unpublishStallCheck(ctx, rec, target); err != nil {
			return nil, err
		}
	}
	if err := d.unpublish(ctx, volumeID, rec, hasRecord, target); err != nil {
		return nil, err
	}
	if !hasRecord {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	before := len(rec.Publications)
	rec.Publications = slices.DeleteFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == target })
	if len(rec.Publications) != before {
		if err := d.deps.Intents.Update(rec); err != nil {
			return nil, internal(err, "record unpublication of volume %s", volumeID)
		}
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume", "volumeID", volumeID, "targetPath", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func ptr[T any](v T) *T { return &v }

// publishedContext reads the volume context and publish context of a
// NodePublishVolume request, which kubelet passes as it passed them to
// NodeStageVolume, with the same keys and rules (volume.ParseWithPublish).
// It returns nil when neither carries a key of the contract (only
// Kubernetes' own keys, or nothing): the staged context then stands.
func publishedContext(vc, pc map[string]string) (*volume.Context, error) {
	if !hasContractKey(vc) && !hasContractKey(pc) {
		return nil, nil
	}
	c, _, err := volume.ParseWithPublish(vc, pc, nil)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// hasContractKey reports whether m has a key other than Kubernetes' own.
func hasContractKey(m map[string]string) bool {
	for k := range m {
		if !strings.HasPrefix(k, volume.IgnoredKeyPrefix) {
			return true
		}
	}
	return false
}

// unpublishStallCheck is stallCheck for the unmount of a publication. A
// bind mount's unmount writes nothing while the filesystem stays mounted
// elsewhere (the staging mount holds it), and a block publication binds
// a device node: only the last mount of a filesystem can wait for its
// device.
func (d *Driver) unpublishStallCheck(ctx context.Context, rec volume.Record, target string) error {
	if rec.AccessType != volume.AccessMount {
		return nil
	}
	if mounted, err := isMountPoint(d.deps.Mounter, rec.StagingPath); err == nil && mounted {
		return nil
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return err
	}
	return d.stallCheckNow(ctx, rec, att, target, "an unmount")
}
