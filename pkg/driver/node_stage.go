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

	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// maxUnmountLayers bounds the unmount loop of NodeUnstage: mounts stacked on
// one path by a crashed retry are peeled off one by one.
const maxUnmountLayers = 8

// NodeStageVolume attaches the volume and, for filesystem access, formats
// it if blank and mounts it at the staging path. Every argument is
// validated before the host is touched. Intent is durable first: under the
// target's lease an attaching record is written before the first connect
// or login, so a crash at any later point leaves a record that says what
// may exist; the record becomes staged when the stage succeeded. A stage
// of a volume whose record is attaching (an earlier stage was interrupted)
// or detaching resumes it.
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

	prev, err := d.deps.Intents.Get(volumeID)
	hadRecord := err == nil
	// wasStaged: the CO was told this volume is staged; a failed restage
	// leaves it as it was.
	wasStaged := hadRecord && prev.State == volume.StateStaged
	switch {
	case hadRecord:
		if why := stageConflict(prev, want); why != "" {
			return nil, alreadyExists("volume %s is already %s with different arguments: %s", volumeID, prev.State, why)
		}
		// A restage keeps the publications: a pod may still have the
		// volume bind-mounted, and the record is what tells NodePublish,
		// NodeUnpublish and NodeUnstage so.
		want.Publications = prev.Publications
		if wasStaged {
			// A staged device the kernel replaced is unmounted first (or
			// the call fails while a publication holds it): the volume is
			// then no longer in place and is staged again.
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
			// Recorded but no longer in place (a node reboot drops mounts
			// and connections): stage it again; the record stays staged.
			klog.V(2).InfoS("Restaging recorded volume that is no longer in place", "volumeID", volumeID, "stagingPath", staging)
		} else {
			klog.V(2).InfoS("Resuming an interrupted intent", "volumeID", volumeID, "state", prev.State, "since", prev.StateSince)
		}
	case errors.Is(err, volume.ErrNotFound):
	default:
		return nil, internal(err, "read record of volume %s", volumeID)
	}

	a, err := d.attach(ctx, att, want, secrets, hadRecord, wasStaged)
	if err != nil {
		return nil, err
	}
	want.Device, want.DevNum = a.Device.Path, a.Device.Number

	// The target's lease is not held across format and mount (a mkfs may
	// take minutes): the attaching record protects the volume as a
	// co-tenant meanwhile. A failure undoes what this call created,
	// under the lease again.
	fail := func(err error, mounted bool) error {
		if mounted {
			if uerr := d.deps.Mounter.Unmount(staging); uerr != nil {
				klog.ErrorS(uerr, "Rollback: unmount staging path failed", "volumeID", volumeID, "stagingPath", staging)
			}
		}
		if !wasStaged {
			d.undo(ctx, att, a, hadRecord)
		}
		return err
	}
	// Nothing holds the device open until it is mounted (or, for raw
	// block, published): the attacher checks that it is still the
	// volume's device to use, or names what took its place.
	if _, err := d.checkDevice(ctx, att, &want); err != nil {
		return nil, fail(err, false)
	}
	mountedNow := false
	if vc.access == volume.AccessMount {
		mountedNow, err = d.mountStaging(want)
		if err != nil {
			// The device may have been taken between the check and the
			// mount (a map assembled over a disk after its mkfs): the
			// mount then fails busy, and the device that took its place
			// holds the same data.
			changed, cerr := d.checkDevice(ctx, att, &want)
			switch {
			case cerr != nil:
				// The check says why the mount failed and whether a
				// retry may succeed: its code is the answer.
				return nil, fail(fmt.Errorf("%w (after the mount failed: %v)", cerr, err), false)
			case !changed:
				return nil, fail(err, false)
			}
			if mountedNow, err = d.mountStaging(want); err != nil {
				return nil, fail(err, false)
			}
		}
	}

	want.State = volume.StateStaged
	want.StagedAt = d.deps.Now().UTC()
	if err := d.deps.Intents.Update(want); err != nil {
		return nil, fail(internal(err, "record staged volume %s", volumeID), mountedNow)
	}
	klog.V(2).InfoS("Staged volume", "volumeID", volumeID, "stagingPath", staging, "accessType", vc.access, "fsType", vc.fsType, "device", want.Device)
	if d.deps.Refresher != nil {
		if err := d.deps.Refresher.RefreshStaged(ctx, want); err != nil {
			klog.ErrorS(err, "Could not write the staged volume into the node model; the next tick will", "volumeID", volumeID)
		}
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// attach runs the attach under the target's lease: it writes the
// attaching record first (unless the volume is staged already: a staged
// record protects it as well), attaches with the target's co-tenants, and
// records the device in the attaching record. A failed attach is undone
// here; the record goes only when everything the call created went too.
func (d *Driver) attach(ctx context.Context, att Attacher, want volume.Record, secrets volume.Secrets, hadRecord, wasStaged bool) (volume.Attachment, error) {
	volumeID := want.VolumeID
	lease, err := d.deps.Intents.Lock(ctx, want.Target(), "NodeStageVolume "+volumeID)
	if err != nil {
		return volume.Attachment{}, err
	}
	defer lease.Unlock()
	co, err := lease.CoTenants(volumeID)
	if err != nil {
		return volume.Attachment{}, internal(err, "read co-tenants of volume %s", volumeID)
	}
	if !wasStaged {
		want.State = volume.StateAttaching
		if err := lease.Put(want); err != nil {
			return volume.Attachment{}, internal(err, "record intent to attach volume %s", volumeID)
		}
	}
	a, err := att.Attach(ctx, volume.AttachRequest{VolumeID: volumeID, Context: want.Context, Secrets: secrets, ReadOnly: want.ReadOnly, CoTenants: co})
	if err != nil {
		err = fmt.Errorf("attach volume %s: %w", volumeID, err)
		if wasStaged {
			return a, err
		}
		if uerr := att.Undo(ctx, a, co); uerr != nil {
			klog.ErrorS(uerr, "Failed attach: keeping its attaching record until what it created is removed", "volumeID", volumeID, "created", createdString(a))
			return a, err
		}
		if !hadRecord {
			if derr := lease.Delete(volumeID); derr != nil {
				klog.ErrorS(derr, "Failed attach: could not remove its attaching record", "volumeID", volumeID)
			}
		}
		return a, err
	}
	klog.V(2).InfoS("Attached volume", "volumeID", volumeID, "transport", want.Context.Transport, "device", a.Device.Path, "sizeBytes", a.Device.SizeBytes, "created", createdString(a))
	// The number recorded is the device node's, checked against the
	// kernel's: it is what the staged-device check compares with.
	num, err := attachedNumber(a.Device)
	if err != nil {
		if !wasStaged {
			d.undoLocked(ctx, att, a, co, lease, hadRecord)
		}
		return a, err
	}
	a.Device.Number = num
	if !wasStaged {
		want.Device, want.DevNum = a.Device.Path, a.Device.Number
		if err := lease.Put(want); err != nil {
			// The attaching record without a device still says what may
			// exist; undo now rather than mount a device nobody recorded.
			d.undoLocked(ctx, att, a, co, lease, hadRecord)
			return a, internal(err, "record device of volume %s", volumeID)
		}
	}
	return a, nil
}

// undo removes what a's attach created after a later step failed, under
// the target's lease again, and the attaching record when everything
// went (and there was no record before the call).
func (d *Driver) undo(ctx context.Context, att Attacher, a volume.Attachment, hadRecord bool) {
	ctx = context.WithoutCancel(ctx)
	lease, err := d.deps.Intents.Lock(ctx, a.Context.Target(), "NodeStageVolume rollback "+a.VolumeID)
	if err != nil {
		klog.ErrorS(err, "Rollback: cannot take the target; keeping the attaching record", "volumeID", a.VolumeID)
		return
	}
	defer lease.Unlock()
	co, err := lease.CoTenants(a.VolumeID)
	if err != nil {
		klog.ErrorS(err, "Rollback: cannot read co-tenants; keeping the attaching record", "volumeID", a.VolumeID)
		return
	}
	d.undoLocked(ctx, att, a, co, lease, hadRecord)
}

func (d *Driver) undoLocked(ctx context.Context, att Attacher, a volume.Attachment, co volume.CoTenants, lease *intent.Lease, hadRecord bool) {
	if err := att.Undo(ctx, a, co); err != nil {
		klog.ErrorS(err, "Rollback: keeping the attaching record until what the stage created is removed", "volumeID", a.VolumeID, "created", createdString(a))
		return
	}
	if hadRecord {
		return // an earlier attempt may have created more: NodeUnstage or the reconciliation finishes it
	}
	if err := lease.Delete(a.VolumeID); err != nil {
		klog.ErrorS(err, "Rollback: could not remove the attaching record", "volumeID", a.VolumeID)
	}
}

// checkDevice asks an attacher that implements DeviceChecker whether
// rec's device is still the one to use. When another device has taken
// its place it switches rec to it, records the new device in the
// volume's record, and reports changed.
func (d *Driver) checkDevice(ctx context.Context, att Attacher, rec *volume.Record) (changed bool, err error) {
	dc, ok := att.(DeviceChecker)
	if !ok {
		return false, nil
	}
	dev, err := dc.CheckDevice(ctx, *rec)
	if err != nil {
		return false, fmt.Errorf("check device %s of volume %s: %w", rec.Device, rec.VolumeID, err)
	}
	if dev.Path == rec.Device && dev.Number == rec.DevNum {
		return false, nil
	}
	klog.V(2).InfoS("Volume's device changed since the attach", "volumeID", rec.VolumeID, "device", rec.Device, "devNum", rec.DevNum, "newDevice", dev.Path, "newDevNum", dev.Number)
	rec.Device, rec.DevNum = dev.Path, dev.Number
	cur, err := d.deps.Intents.Get(rec.VolumeID)
	if err != nil {
		return false, internal(err, "read record of volume %s", rec.VolumeID)
	}
	cur.Device, cur.DevNum = dev.Path, dev.Number
	if err := d.deps.Intents.Update(cur); err != nil {
		return false, internal(err, "record new device of volume %s", rec.VolumeID)
	}
	return true, nil
}

func createdString(a volume.Attachment) string {
	if a.Created == nil {
		return ""
	}
	return a.Created.String()
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
	if n, ok := rdevOf(rec.Device); ok && !rec.DevNum.IsZero() && n != rec.DevNum {
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
// Under the target's lease the record is set detaching before the first
// teardown, and the detach spares every other record of the target; while
// a record that may be the target's cannot be read, nothing is torn down
// and the call fails naming the file. It finishes a volume whose record
// is attaching (an interrupted stage) or detaching the same way.
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

	rec, err := d.deps.Intents.Get(volumeID)
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
	lease, err := d.deps.Intents.Lock(ctx, rec.Target(), "NodeUnstageVolume "+volumeID)
	if err != nil {
		return nil, err
	}
	defer lease.Unlock()
	co, err := lease.CoTenants(volumeID)
	if err != nil {
		return nil, internal(err, "read co-tenants of volume %s", volumeID)
	}
	if err := co.Err(); err != nil {
		return nil, fmt.Errorf("detach volume %s: %w", volumeID, err)
	}
	if rec.State != volume.StateDetaching {
		rec.State = volume.StateDetaching
		if err := lease.Put(rec); err != nil {
			return nil, internal(err, "record intent to detach volume %s", volumeID)
		}
	}
	if err := att.Detach(ctx, rec, co); err != nil {
		return nil, fmt.Errorf("detach volume %s: %w", volumeID, err)
	}
	if err := lease.Delete(volumeID); err != nil {
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
