package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// maxUnmountLayers bounds the unmount loop of NodeUnstage: mounts stacked on
// one path by a crashed retry are peeled off one by one.
const maxUnmountLayers = 8

// NodeStageVolume attaches the volume and, for filesystem access, formats
// it if blank and mounts it at the staging path; then records the staged
// volume on disk. Every argument is validated before the host is touched.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	volumeID := req.GetVolumeId()
	staging, err := volumeAndPath(volumeID, "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	vc, err := parseCapability(req.GetVolumeCapability(), d.cfg.DefaultFSType)
	if err != nil {
		return nil, err
	}
	vctx, secrets, err := volume.ParseWithPublish(req.GetVolumeContext(), req.GetPublishContext(), req.GetSecrets())
	if err != nil {
		return nil, err
	}
	att, err := d.attacher(vctx.Transport)
	if err != nil {
		return nil, err
	}
	release, err := d.locks.acquire(volumeID)
	if err != nil {
		return nil, err
	}
	defer release()

	if err := checkDir("staging_target_path", staging); err != nil {
		return nil, err
	}
	want := volume.Record{
		VolumeID:    volumeID,
		Context:     vctx,
		StagingPath: staging,
		AccessType:  vc.access,
		FSType:      vc.fsType,
		MountFlags:  vc.mountFlags,
		ReadOnly:    vc.readOnly,
	}

	prev, err := d.deps.Store.Get(volumeID)
	hadRecord := err == nil
	switch {
	case hadRecord:
		if why := stageConflict(prev, want); why != "" {
			return nil, alreadyExists("volume %s is already staged with different arguments: %s", volumeID, why)
		}
		replaced, err := d.clearReplacedStaging(ctx, prev, att)
		if err != nil {
			return nil, err
		}
		inPlace := false
		if !replaced {
			if inPlace, err = d.stagedInPlace(prev); err != nil {
				return nil, internal(err, "check staged volume %s", volumeID)
			}
		}
		if inPlace {
			klog.V(4).InfoS("Volume already staged", "volumeID", volumeID, "stagingPath", staging)
			return &csi.NodeStageVolumeResponse{}, nil
		}
		// Recorded but no longer in place (a node reboot drops mounts and
		// connections): stage it again; the record is rewritten below.
		klog.V(2).InfoS("Restaging recorded volume that is no longer in place", "volumeID", volumeID, "stagingPath", staging)
	case errors.Is(err, volume.ErrNotFound):
	default:
		return nil, internal(err, "read record of volume %s", volumeID)
	}

	dev, err := att.Attach(ctx, AttachRequest{VolumeID: volumeID, Context: vctx, Secrets: secrets, ReadOnly: vc.readOnly})
	if err != nil {
		return nil, fmt.Errorf("attach volume %s: %w", volumeID, err)
	}
	klog.V(2).InfoS("Attached volume", "volumeID", volumeID, "transport", vctx.Transport, "device", dev.Path, "sizeBytes", dev.SizeBytes)
	want.Device = dev.Path
	number, numErr := attachedNumber(dev)
	want.DeviceNumber = number

	// rollback undoes this call's attach when a later step fails, so a
	// failed NodeStage leaves no half-attached volume behind. A volume that
	// had a record stays attached: it was staged before this call.
	rollback := func(mounted bool) {
		if mounted {
			if err := d.deps.Mounter.Unmount(staging); err != nil {
				klog.ErrorS(err, "Rollback: unmount staging path failed", "volumeID", volumeID, "stagingPath", staging)
			}
		}
		if hadRecord {
			return
		}
		if err := att.Detach(context.WithoutCancel(ctx), want); err != nil {
			klog.ErrorS(err, "Rollback: detach failed", "volumeID", volumeID)
		}
	}

	if numErr != nil {
		rollback(false)
		return nil, numErr
	}
	mountedNow := false
	if vc.access == volume.AccessMount {
		mountedNow, err = d.mountStaging(want)
		if err != nil {
			rollback(false)
			return nil, err
		}
	}

	want.StagedAt = d.deps.Now().UTC()
	if err := d.deps.Store.Put(want); err != nil {
		rollback(mountedNow)
		return nil, internal(err, "record staged volume %s", volumeID)
	}
	klog.V(2).InfoS("Staged volume", "volumeID", volumeID, "stagingPath", staging, "accessType", vc.access, "fsType", vc.fsType, "device", dev.Path)
	return &csi.NodeStageVolumeResponse{}, nil
}

// mountStaging formats the device if it holds no filesystem and mounts it
// at the staging path. mounted reports whether this call made the mount.
func (d *Driver) mountStaging(rec volume.Record) (mounted bool, err error) {
	notMnt, err := d.deps.Mounter.IsLikelyNotMountPoint(rec.StagingPath)
	if err != nil {
		return false, internal(err, "check staging path %s", rec.StagingPath)
	}
	if !notMnt {
		// A mount is already there: the device of an earlier attempt that
		// crashed before writing its record is accepted; anything else is
		// not ours to cover.
		same, err := d.mountedFrom(rec.StagingPath, rec.Device)
		if err != nil {
			return false, internal(err, "inspect mount at %s", rec.StagingPath)
		}
		if !same {
			return false, alreadyExists("staging path %s already has a mount of another device", rec.StagingPath)
		}
		return false, nil
	}
	opts := slices.Clone(rec.MountFlags)
	if rec.ReadOnly {
		opts = append(opts, "ro")
	}
	if rec.FSType == "xfs" {
		// A clone of an xfs volume carries the source's UUID; without
		// nouuid the second mount of that UUID on one node fails.
		opts = append(opts, "nouuid")
	}
	if err := d.deps.Mounter.FormatAndMount(rec.Device, rec.StagingPath, rec.FSType, opts); err != nil {
		return false, internal(err, "format and mount %s at %s", rec.Device, rec.StagingPath)
	}
	return true, nil
}

// stagedInPlace reports whether a recorded volume is still staged: its
// device exists — the device the record numbers, when it numbers one: a
// name the kernel gave to another device since is not it — and, for
// filesystem access, is what is mounted at the staging path.
func (d *Driver) stagedInPlace(rec volume.Record) (bool, error) {
	if fi, err := os.Stat(rec.Device); err != nil || fi.Mode()&os.ModeDevice == 0 {
		return false, nil
	}
	if n, ok := rdevOf(rec.Device); ok && !rec.DeviceNumber.IsZero() && n != rec.DeviceNumber {
		return false, nil
	}
	if rec.AccessType == volume.AccessBlock {
		return true, nil
	}
	notMnt, err := d.deps.Mounter.IsLikelyNotMountPoint(rec.StagingPath)
	if err != nil || notMnt {
		return false, nil
	}
	return d.mountedFrom(rec.StagingPath, rec.Device)
}

// mountedFrom reports whether the mount at path is of device: by device
// number when the mount table and the device node tell it, else by path
// (symlinks of either resolved).
func (d *Driver) mountedFrom(path, device string) (bool, error) {
	if same, known, err := d.sameDevice(path, device); err == nil && known {
		return same, nil
	}
	src, _, err := mountDevice(d.deps.Mounter, path)
	if err != nil {
		return false, err
	}
	return sameFile(src, device), nil
}

// stageConflict explains why want cannot be staged over rec, or returns ""
// when both describe the same staging.
func stageConflict(rec, want volume.Record) string {
	switch {
	case rec.StagingPath != want.StagingPath:
		return fmt.Sprintf("staged at %s, not %s", rec.StagingPath, want.StagingPath)
	case rec.AccessType != want.AccessType:
		return fmt.Sprintf("staged for %s access, not %s", rec.AccessType, want.AccessType)
	case rec.FSType != want.FSType:
		return fmt.Sprintf("staged with filesystem %s, not %s", rec.FSType, want.FSType)
	case !slices.Equal(rec.MountFlags, want.MountFlags):
		// Mount flags may hold credentials (csi.proto): never repeat them.
		return "the mount flags differ"
	case rec.ReadOnly != want.ReadOnly:
		return fmt.Sprintf("staged read-only=%t, not %t", rec.ReadOnly, want.ReadOnly)
	case !rec.Context.Equal(want.Context):
		return "the volume context differs"
	}
	return ""
}

// NodeUnstageVolume unmounts the staging path, detaches the volume and
// removes its record. A volume that is not staged is not an error, unless
// something is mounted at the staging path: without a record pathmend
// cannot tell that mount is the volume's, so it refuses and leaves it.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	volumeID := req.GetVolumeId()
	staging, err := volumeAndPath(volumeID, "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	release, err := d.locks.acquire(volumeID)
	if err != nil {
		return nil, err
	}
	defer release()

	rec, err := d.deps.Store.Get(volumeID)
	hasRecord := err == nil
	if err != nil && !errors.Is(err, volume.ErrNotFound) {
		return nil, internal(err, "read record of volume %s", volumeID)
	}
	if hasRecord {
		if rec.StagingPath != staging {
			return nil, failedPrecondition("volume %s is staged at %s, not %s", volumeID, rec.StagingPath, staging)
		}
		// Detaching under a live publication would pull the device from
		// under a running pod; the CO must unpublish first.
		for _, p := range rec.Publications {
			if mounted, _ := isMountPoint(d.deps.Mounter, p.TargetPath); mounted {
				return nil, failedPrecondition("volume %s is still published at %s", volumeID, p.TargetPath)
			}
		}
	}
	if !hasRecord {
		if err := d.unstageUnrecorded(volumeID, staging); err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := d.unmountAll(staging); err != nil {
		return nil, err
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return nil, err
	}
	if err := att.Detach(ctx, rec); err != nil {
		return nil, fmt.Errorf("detach volume %s: %w", volumeID, err)
	}
	if err := d.deps.Store.Delete(volumeID); err != nil {
		return nil, internal(err, "remove record of volume %s", volumeID)
	}
	klog.V(2).InfoS("Unstaged volume", "volumeID", volumeID, "stagingPath", staging, "device", rec.Device)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// unmountAll unmounts path until nothing is mounted there. A path that does
// not exist is already unmounted.
func (d *Driver) unmountAll(path string) error {
	for range maxUnmountLayers {
		mounted, err := isMountPoint(d.deps.Mounter, path)
		if err != nil {
			return internal(err, "check mount at %s", path)
		}
		if !mounted {
			return nil
		}
		if err := d.deps.Mounter.Unmount(path); err != nil {
			return internal(err, "unmount %s", path)
		}
	}
	return internal(nil, "%s still mounted after %d unmounts", path, maxUnmountLayers)
}

// checkDir requires path to be an existing directory.
func checkDir(field, path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return invalidArgument("%s %s does not exist", field, path)
	case err != nil:
		return internal(err, "stat %s", path)
	case !fi.IsDir():
		return invalidArgument("%s %s is not a directory", field, path)
	}
	return nil
}

// sameFile reports whether a and b name the same file after resolving
// symlinks (/dev/disk/by-id links, /dev/mapper names).
func sameFile(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return ra == rb
}
