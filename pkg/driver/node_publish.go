package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

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
	staging, err := checkPath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	vc, err := parseCapability(req.GetVolumeCapability(), d.cfg.DefaultFSType)
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

	if err := d.bindTarget(rec, target, readOnly, vc.mountFlags); err != nil {
		return nil, err
	}
	if idx >= 0 {
		rec.Publications[idx].ReadOnly = readOnly
	} else {
		rec.Publications = append(rec.Publications, volume.Publication{TargetPath: target, ReadOnly: readOnly})
	}
	if err := d.deps.Intents.Update(rec); err != nil {
		if uerr := d.deps.Mounter.Unmount(target); uerr != nil {
			klog.ErrorS(uerr, "Rollback: unmount target path failed", "volumeID", volumeID, "targetPath", target)
		}
		return nil, internal(err, "record publication of volume %s", volumeID)
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

// NodeUnpublishVolume unmounts and removes the target path. A target that
// is already gone is OK.
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

	if err := d.unmountAll(target); err != nil {
		return nil, err
	}
	if err := mount.CleanupMountPoint(target, d.deps.Mounter, true); err != nil {
		return nil, internal(err, "remove target path %s", target)
	}
	rec, err := d.deps.Intents.Get(volumeID)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return &csi.NodeUnpublishVolumeResponse{}, nil
	case err != nil:
		return nil, internal(err, "read record of volume %s", volumeID)
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
