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

	targetMounted, err := isMountPoint(d.deps.Mounter, target)
	if err != nil {
		return nil, internal(err, "check mount at %s", target)
	}
	idx := slices.IndexFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == target })
	if targetMounted {
		if idx < 0 {
			return nil, alreadyExists("target path %s already has a mount that is not volume %s", target, volumeID)
		}
		if rec.Publications[idx].ReadOnly != readOnly {
			return nil, alreadyExists("volume %s is published at %s with readonly=%t, not %t", volumeID, target, rec.Publications[idx].ReadOnly, readOnly)
		}
		klog.V(4).InfoS("Volume already published", "volumeID", volumeID, "targetPath", target)
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if vc.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		for _, p := range rec.Publications {
			if p.TargetPath == target {
				continue
			}
			if mounted, _ := isMountPoint(d.deps.Mounter, p.TargetPath); mounted {
				return nil, failedPrecondition("volume %s has a single-writer access mode and is already published at %s", volumeID, p.TargetPath)
			}
		}
	}

	// A filesystem that takes no writes is checked and mounted again
	// before a pod gets it, when no other pod holds it; while one does,
	// this publish fails saying so.
	if att, err := d.attacher(rec.Context.Transport); err == nil {
		if err := d.remountDamaged(ctx, rec, att); err != nil {
			return nil, err
		}
	}

	if idx < 0 && len(rec.Publications) >= volume.MaxPublications {
		return nil, resourceExhausted("volume %s is published at %d target paths, the most one volume may have on a node", volumeID, len(rec.Publications))
	}
	// The publication is recorded before the bind mount, as every intent
	// is: a crash between the two leaves a record naming the target path,
	// so a retried NodePublish mounts it and NodeUnpublish releases it. A
	// mount recorded nowhere would be refused as someone else's by both,
	// for ever.
	prev := slices.Clone(rec.Publications)
	if idx >= 0 {
		rec.Publications[idx].ReadOnly = readOnly
	} else {
		rec.Publications = append(rec.Publications, volume.Publication{TargetPath: target, ReadOnly: readOnly})
	}
	if err := d.deps.Intents.Update(rec); err != nil {
		return nil, internal(err, "record publication of volume %s", volumeID)
	}
	if err := d.bindTarget(rec, target, readOnly, vc.mountFlags); err != nil {
		rec.Publications = prev
		if uerr := d.deps.Intents.Update(rec); uerr != nil {
			klog.ErrorS(uerr, "Rollback: forget the publication failed; NodeUnpublishVolume forgets it", "volumeID", volumeID, "targetPath", target)
		}
		return nil, err
	}
	klog.V(2).InfoS("Published volume", "volumeID", volumeID, "targetPath", target, "readOnly", readOnly, "accessType", rec.AccessType)
	return &csi.NodePublishVolumeResponse{}, nil
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
		// The target of a block publication is a file the device node is
		// bound onto; kubelet creates only its parent.
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return internal(err, "create parent of %s", target)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return internal(err, "create block target file %s", target)
		}
		_ = f.Close()
	} else {
		if err := os.MkdirAll(target, 0o750); err != nil {
			return internal(err, "create target directory %s", target)
		}
	}
	if err := d.deps.Mounter.Mount(source, target, "", opts); err != nil {
		return internal(err, "bind mount %s at %s", source, target)
	}
	return nil
}

// NodeUnpublishVolume unmounts and removes the target path when it holds
// the volume's publication (see owner.go); a mount of anything else is
// FailedPrecondition and left alone. A target with nothing mounted is OK.
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
	recorded := hasRecord && slices.ContainsFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == target })
	if hasRecord {
		if err := d.unpublishStallCheck(ctx, rec, target); err != nil {
			return nil, err
		}
	}
	if err := d.releaseTarget(ctx, volumeID, rec, hasRecord, recorded, target); err != nil {
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
	klog.V(2).InfoS("Unpublished volume", "volumeID", volumeID, "targetPath", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

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
