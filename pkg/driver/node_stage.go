package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/volume"
)

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
	logger := klog.FromContext(ctx)

	if err := checkDir("staging_target_path", staging); err != nil {
		// A staged volume's staging path a foreign mount hides answers
		// for that mount.
		if prev, gerr := d.deps.Intents.Get(volumeID); gerr == nil && prev.StagingPath == staging {
			if v, lerr := d.layers(); lerr == nil {
				c := stagingClaim(prev)
				if s := c.inspect(v); s.foreign != nil {
					return nil, foreignError(volumeID, c, s)
				}
			}
		}
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
		// NodeUnpublish and NodeUnstage so. It keeps the staging layer
		// too, until a mount replaces it: a mount an interrupted stage
		// made is the volume's.
		want.Publications = prev.Publications
		want.StagingLayer = prev.StagingLayer
		if wasStaged {
			// A staged device the kernel replaced is unmounted first (or
			// the call fails while a publication holds it): the volume is
			// then no longer in place and is staged again. Both checks
			// compare with the devices the volume's transport reads now.
			health := att.Health(ctx, prev)
			replaced, err := d.clearReplacedStaging(ctx, &prev, health)
			if err != nil {
				return nil, err
			}
			inPlace := false
			if !replaced {
				if inPlace, err = d.stagedInPlace(ctx, prev, health.Devices); err != nil {
					return nil, err
				}
			}
			if inPlace {
				// In place, but a filesystem that takes no writes is
				// unmounted to be checked and mounted again (or the call
				// fails while a publication holds it).
				cleared, err := d.clearDamagedStaging(ctx, &prev, att)
				if err != nil {
					return nil, err
				}
				if !cleared {
					logger.V(4).Info("Volume already staged", "volumeID", volumeID, "stagingPath", staging)
					return &csi.NodeStageVolumeResponse{}, nil
				}
				want.StagingLayer = prev.StagingLayer
			}
			// Recorded but no longer in place (a node reboot drops mounts
			// and connections): stage it again; the record stays staged.
			logger.V(2).Info("Restaging recorded volume that is no longer in place", "volumeID", volumeID, "stagingPath", staging)
		} else {
			logger.V(2).Info("Resuming an interrupted intent", "volumeID", volumeID, "state", prev.State, "since", prev.StateSince)
		}
	case errors.Is(err, volume.ErrNotFound):
	default:
		return nil, internal(err, "read record of volume %s", volumeID)
	}

	a, sawCo, err := d.attach(ctx, att, want, secrets, hadRecord, wasStaged)
	if err != nil {
		return nil, err
	}
	want.Device, want.DevNum = a.Device.Path, a.Device.Number

	// The target's lease is not held across format and mount (a mkfs may
	// take minutes): the attaching record protects the volume as a
	// co-tenant meanwhile. A failure undoes what this call created,
	// under the lease again.
	var made *mounts.Layer // the staging mount this call made
	fail := func(err error) error {
		if made != nil {
			if uerr := d.unmountLayer(ctx, volumeID, *made); uerr != nil {
				// Refused, or still in the kernel (the device stays
				// attached under its attaching record until the unmount
				// returns; the reconciliation or a retry finishes).
				logger.Error(uerr, "Rollback: unmount the staging mount failed; keeping the attaching record", "volumeID", volumeID, "stagingPath", staging, "mount", made.ID)
				return err
			}
		}
		var unknown *mountUnknown
		if errors.As(err, &unknown) {
			// The device may be mounted: the record that names the mount
			// stays, and NodeUnstage releases it.
			logger.Error(err, "Rollback: the staging path's mounts cannot be told; keeping the record that names the mount", "volumeID", volumeID, "stagingPath", staging)
			return err
		}
		if !wasStaged {
			d.undo(ctx, att, a, hadRecord, sawCo)
		}
		return err
	}
	// Nothing holds the device open until it is mounted (or, for raw
	// block, published): the attacher checks that it is still the
	// volume's device to use, or names what took its place.
	if _, err := d.checkDevice(ctx, att, &want); err != nil {
		return nil, fail(err)
	}
	if vc.access == volume.AccessMount {
		var prevRec *volume.Record
		if hadRecord {
			prevRec = &prev
		}
		made, err = d.mountStaging(ctx, &want, prevRec, wasStaged)
		var unknown *mountUnknown
		if err != nil && made == nil && !isCoded(err, codes.FailedPrecondition) && !errors.As(err, &unknown) {
			// The device may have been taken between the check and the
			// mount (a map assembled over a disk after its mkfs): the
			// mount then fails busy, and the device that took its place
			// holds the same data.
			changed, cerr := d.checkDevice(ctx, att, &want)
			switch {
			case cerr != nil:
				// The check says why the mount failed and whether a
				// retry may succeed: its code is the answer.
				return nil, fail(fmt.Errorf("%w (after the mount failed: %v)", cerr, err))
			case !changed:
				return nil, fail(err)
			}
			if made, err = d.mountStaging(ctx, &want, prevRec, wasStaged); err != nil {
				return nil, fail(err)
			}
		} else if err != nil {
			return nil, fail(err)
		}
	}

	want.State = volume.StateStaged
	want.StagedAt = d.deps.Clock.Now().UTC()
	if err := d.deps.Intents.Update(want); err != nil {
		return nil, fail(internal(err, "record staged volume %s", volumeID))
	}
	logger.V(2).Info("Staged volume", "volumeID", volumeID, "stagingPath", staging, "accessType", vc.access, "fsType", vc.fsType, "device", want.Device)
	if d.deps.Refresher != nil {
		if err := d.deps.Refresher.RefreshStaged(ctx, want); err != nil {
			logger.Error(err, "Could not write the staged volume into the node model; the next tick will", "volumeID", volumeID)
		}
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// attach runs the attach under the target's lease: it writes the
// attaching record first (unless the volume is staged already: a staged
// record protects it as well), attaches with the target's co-tenants, and
// records the device in the attaching record. A failed attach is undone
// here; the record goes only when everything the call created went too.
//
// sawCo reports whether the target had other records when the attach
// began: pathmend's paths of the target were there for their sake, and a
// co-tenant's teardown may have spared some for this stage (see
// undoLocked).
func (d *Driver) attach(ctx context.Context, att Attacher, want volume.Record, secrets volume.Secrets, hadRecord, wasStaged bool) (a volume.Attachment, sawCo bool, err error) {
	volumeID := want.VolumeID
	lease, err := d.deps.Intents.Lock(ctx, want.Target(), "NodeStageVolume "+volumeID)
	if err != nil {
		return volume.Attachment{}, false, err
	}
	defer lease.Unlock()
	co, err := lease.CoTenants(volumeID)
	if err != nil {
		return volume.Attachment{}, false, internal(err, "read co-tenants of volume %s", volumeID)
	}
	sawCo = len(co.Records) > 0
	if !wasStaged {
		want.State = volume.StateAttaching
		if err := lease.Put(want); err != nil {
			return volume.Attachment{}, sawCo, internal(err, "record intent to attach volume %s", volumeID)
		}
	}
	a, err = att.Attach(ctx, volume.AttachRequest{VolumeID: volumeID, Context: want.Context, Secrets: secrets, ReadOnly: want.ReadOnly, CoTenants: co})
	if err != nil {
		err = fmt.Errorf("attach volume %s: %w", volumeID, err)
		if wasStaged {
			return a, sawCo, err
		}
		d.undoLocked(ctx, att, a, co, lease, hadRecord, sawCo)
		return a, sawCo, err
	}
	klog.FromContext(ctx).V(2).Info("Attached volume", "volumeID", volumeID, "transport", want.Context.Transport, "device", a.Device.Path, "sizeBytes", a.Device.SizeBytes, "created", createdString(a))
	// The number recorded is the device node's, checked against the
	// kernel's: it is what the staged-device check compares with.
	num, err := attachedNumber(a.Device)
	if err != nil {
		if !wasStaged {
			d.undoLocked(ctx, att, a, co, lease, hadRecord, sawCo)
		}
		return a, sawCo, err
	}
	a.Device.Number = num
	if !wasStaged {
		want.Device, want.DevNum = a.Device.Path, a.Device.Number
		if err := lease.Put(want); err != nil {
			// The attaching record without a device still says what may
			// exist; undo now rather than mount a device nobody recorded.
			d.undoLocked(ctx, att, a, co, lease, hadRecord, sawCo)
			return a, sawCo, internal(err, "record device of volume %s", volumeID)
		}
	}
	return a, sawCo, nil
}

// undo removes what a's attach created after a later step failed, under
// the target's lease again, and the attaching record when everything
// went (and there was no record before the call).
func (d *Driver) undo(ctx context.Context, att Attacher, a volume.Attachment, hadRecord, sawCo bool) {
	ctx = context.WithoutCancel(ctx)
	lease, err := d.deps.Intents.Lock(ctx, a.Context.Target(), "NodeStageVolume rollback "+a.VolumeID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Rollback: cannot take the target; keeping the attaching record", "volumeID", a.VolumeID)
		return
	}
	defer lease.Unlock()
	co, err := lease.CoTenants(a.VolumeID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Rollback: cannot read co-tenants; keeping the attaching record", "volumeID", a.VolumeID)
		return
	}
	d.undoLocked(ctx, att, a, co, lease, hadRecord, sawCo)
}

// undoLocked undoes a's attach under the target's lease and removes the
// attaching record when it was this call's. Paths must never be left that
// no record names, even when stages of co-tenants fail one after the
// other:
//
//   - while other records of the target remain, the undo may have left
//     what the attach created for their sake: the attaching record stays
//     and says so, and NodeUnstage, a retried NodeStage or the
//     reconciliation removes those paths once no record needs them;
//   - when other records of the target existed as the attach began (sawCo)
//     and none is left, their teardown spared the paths this stage
//     needed, whoever connected them: the target's paths no record needs
//     go too, as at NodeUnstage.
//
// With no record of the target at the attach and none now, only what the
// attach created goes: what was there before is someone else's.
func (d *Driver) undoLocked(ctx context.Context, att Attacher, a volume.Attachment, co volume.CoTenants, lease *intent.Lease, hadRecord, sawCo bool) {
	if err := att.Undo(ctx, a, co); err != nil {
		klog.FromContext(ctx).Error(err, "Rollback: keeping the attaching record until what the stage created is removed", "volumeID", a.VolumeID, "created", createdString(a))
		return
	}
	if hadRecord {
		return // an earlier attempt may have created more: NodeUnstage or the reconciliation finishes it
	}
	if a.Created != nil && len(co.Records) > 0 {
		klog.FromContext(ctx).V(2).Info("Rollback: keeping the attaching record: what the stage created may serve a co-tenant, and goes when no record needs it", "volumeID", a.VolumeID, "created", createdString(a))
		return
	}
	if cur, err := d.deps.Intents.Get(a.VolumeID); err == nil && sawCo && len(co.Records) == 0 && len(co.Unreadable) == 0 {
		if err := att.Detach(ctx, cur, co); err != nil {
			klog.FromContext(ctx).Error(err, "Rollback: keeping the attaching record until the paths spared for it are removed", "volumeID", a.VolumeID)
			return
		}
	}
	if err := lease.Delete(a.VolumeID); err != nil {
		klog.FromContext(ctx).Error(err, "Rollback: could not remove the attaching record", "volumeID", a.VolumeID)
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
	klog.FromContext(ctx).V(2).Info("Volume's device changed since the attach", "volumeID", rec.VolumeID, "device", rec.Device, "devNum", rec.DevNum, "newDevice", dev.Path, "newDevNum", dev.Number)
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

// mountStaging formats rec's device if it holds no filesystem and mounts
// it at the staging path, and sets rec.StagingLayer to the mount. Before
// the mount it records the layer the mount will show, so that a crash
// right after it leaves a record that names it. made is the mount when
// this call made it (nil when the volume's mount of an earlier attempt
// was there already). The volume's own mount of another device (an
// interrupted stage's, of a device the kernel replaced since) is
// unmounted first when the volume was not staged (no pod can hold it);
// otherwise it is AlreadyExists. Anything else mounted there, or a
// staging path with content or mounts below it, is FailedPrecondition
// naming it.
func (d *Driver) mountStaging(ctx context.Context, rec *volume.Record, prev *volume.Record, wasStaged bool) (made *mounts.Layer, err error) {
	v, err := d.layers()
	if err != nil {
		return nil, err
	}
	c := stagingClaim(*rec)
	if prev != nil {
		// A mount of an earlier attempt, or of the device the volume
		// was staged with, is the volume's too.
		pc := stagingClaim(*prev)
		like := c.like
		c.rec, c.like = prev.StagingLayer, func(l mounts.Layer) bool { return like(l) || pc.like(l) }
	}
	s := c.inspect(v)
	if s.foreign != nil {
		return nil, foreignError(rec.VolumeID, c, s)
	}
	if top, ok := s.top(); ok {
		// The volume's mount of an earlier attempt that crashed before
		// it recorded it: accepted when it is of the device to stage.
		if stagedFrom(*rec, top) {
			rec.StagingLayer = ptr(top.Record(v.ns))
			return nil, nil
		}
		if wasStaged {
			return nil, alreadyExists("staging path %s already has a mount of another device", rec.StagingPath)
		}
		klog.FromContext(ctx).V(2).Info("Unmounting an interrupted stage's mount of another device", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "mount", top.String())
		if _, err := d.release(ctx, rec.VolumeID, c); err != nil {
			return nil, err
		}
		if v, err = d.layers(); err != nil {
			return nil, err
		}
	}
	if _, err := emptyPlace(v, "staging_target_path", rec.StagingPath, true); err != nil {
		return nil, err
	}
	if err := d.checkContainingMount(v, "staging_target_path", rec.StagingPath); err != nil {
		return nil, err
	}
	cur, err := d.deps.Intents.Get(rec.VolumeID)
	if err != nil {
		return nil, internal(err, "read record of volume %s", rec.VolumeID)
	}
	cur.StagingLayer = pendingStaging(*rec)
	if err := d.deps.Intents.Update(cur); err != nil {
		return nil, internal(err, "record the intent to mount volume %s", rec.VolumeID)
	}
	rec.StagingLayer = cur.StagingLayer
	c.rec = cur.StagingLayer
	opts := stagingOptions(*rec)
	mountErr := d.formatOrCheckAndMount(*rec, opts)
	after, err := d.layers()
	if err != nil {
		// The mount cannot be told: the pending layer names it.
		return nil, &mountUnknown{err}
	}
	if ce := (*codedError)(nil); mountErr != nil && !errors.As(mountErr, &ce) {
		// The check's and the mount's own answers keep their codes.
		mountErr = internal(mountErr, "format and mount %s at %s", rec.Device, rec.StagingPath)
	}
	l, isNew, madeNow := newTop(v, after, c, rec.Device)
	switch {
	case mountErr != nil && isNew && madeNow:
		// A mount that failed after it mounted (a remount) left a layer.
		return &l, mountErr
	case mountErr != nil:
		return nil, mountErr
	case !isNew || !madeNow:
		return nil, internal(nil, "after the mount, the top of staging path %s is not a new mount of %s", quoteShort(rec.StagingPath), rec.Device)
	case !c.ours(after, l):
		return &l, internal(nil, "after the mount, the top of staging path %s is %s, not the filesystem of %s", quoteShort(rec.StagingPath), l, rec.Device)
	}
	rec.StagingLayer = ptr(l.Record(after.ns))
	klog.FromContext(ctx).V(4).Info("Mounted staging path", "volumeID", rec.VolumeID, "stagingPath", rec.StagingPath, "mount", l.ID)
	return &l, nil
}

// formatOrCheckAndMount formats rec's device when it is blank and mounts
// it (SafeFormatAndMount, which refuses a read-only stage of a blank
// device); an existing filesystem is checked before a read-write mount, as
// SafeFormatAndMount does, but a check that fails stops the stage
// (fscheck.go).
func (d *Driver) formatOrCheckAndMount(rec volume.Record, opts []string) error {
	format, err := d.deps.Mounter.GetDiskFormat(rec.Device)
	if err != nil {
		return fmt.Errorf("read the format of %s: %w", rec.Device, err)
	}
	if format == "" {
		return d.deps.Mounter.FormatAndMount(rec.Device, rec.StagingPath, rec.FSType, opts)
	}
	if !rec.ReadOnly {
		if err := d.checkFilesystem(rec, format); err != nil {
			return err
		}
	}
	return d.mountExisting(rec, format, opts)
}

// stagingOptions are the mount options of rec's staging mount: its mount
// flags, ro for a read-only stage, nouuid for XFS (a clone carries its
// source's UUID, and a second mount of one UUID on a node fails without
// it), and errors=remount-ro for ext3 and ext4 unless the flags name an
// errors= behaviour: mke2fs leaves "continue" in the superblock, and a
// filesystem that found its metadata damaged must stop writing, not go on
// (docs/operations.md#pathmendfilesystemreadonly).
func stagingOptions(rec volume.Record) []string {
	opts := slices.Clone(rec.MountFlags)
	if rec.ReadOnly {
		opts = append(opts, "ro")
	}
	switch rec.FSType {
	case "xfs":
		opts = append(opts, "nouuid")
	case "ext3", "ext4":
		if !slices.ContainsFunc(opts, func(o string) bool { return strings.HasPrefix(o, "errors=") }) {
			opts = append(opts, "errors=remount-ro")
		}
	}
	return opts
}

// mountUnknown is a failure after which whether the staging path holds
// the mount the call made cannot be told (the mount table could not be
// read): nothing is unmounted and the record stays.
type mountUnknown struct{ err error }

func (e *mountUnknown) Error() string {
	return "after the mount, the mount table cannot be read: " + e.err.Error()
}

func (e *mountUnknown) Unwrap() error { return e.err }

// stagedInPlace reports whether a recorded volume is still staged: its
// device exists — the device the record numbers, when it numbers one: a
// name the kernel gave to another device since is not it — and, for
// filesystem access, the volume's mount of it is on top of the staging
// path; for block access, it is one of the devices the volume's
// transport reads now (current). A layer that is not the volume's there
// is FailedPrecondition naming it. A mount of the volume the record does
// not name exactly (made before a crash or a restart in a new mount
// namespace) is recorded.
//
// Why block access asks the transport: nothing holds a block volume's
// device while no pod has it open, so once it is gone — after a reboot,
// or when every path went for a while — the kernel may give its name and
// number to another volume's device. A staging mount holds its device,
// whose number is not reused while it is mounted, and no mount survives
// a reboot.
func (d *Driver) stagedInPlace(ctx context.Context, rec volume.Record, current []volume.BlockDevice) (bool, error) {
	if fi, err := os.Stat(rec.Device); err != nil || fi.Mode()&os.ModeDevice == 0 {
		if rec.AccessType == volume.AccessBlock || rec.StagingLayer == nil {
			return false, nil
		}
	} else if n, ok := rdevOf(rec.Device); ok && !rec.DevNum.IsZero() && n != rec.DevNum {
		return false, nil
	}
	v, err := d.layers()
	if err != nil {
		return false, err
	}
	c := stagingClaim(rec)
	s := c.inspect(v)
	if s.foreign != nil {
		return false, foreignError(rec.VolumeID, c, s)
	}
	if rec.AccessType == volume.AccessBlock {
		n := rec.DevNum
		if n.IsZero() {
			n, _ = rdevOf(rec.Device)
		}
		return slices.ContainsFunc(current, func(b volume.BlockDevice) bool { return b.Number == n }), nil
	}
	top, ok := s.top()
	if !ok {
		return false, nil
	}
	if _, err := os.Stat(rec.Device); err != nil {
		return false, nil
	}
	if !c.exact(v, top) {
		rec.StagingLayer = ptr(top.Record(v.ns))
		if err := d.deps.Intents.Update(rec); err != nil {
			return false, internal(err, "record the staging layer of volume %s", rec.VolumeID)
		}
		klog.FromContext(ctx).V(2).Info("Recorded the staging mount of a staged volume", "volumeID", rec.VolumeID, "mount", top.ID)
	}
	return true, nil
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
	if !hasRecord {
		if err := d.unstageUnrecorded(ctx, volumeID, staging); err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if rec.StagingPath != staging {
		return nil, failedPrecondition("volume %s is staged at %s, not %s", volumeID, rec.StagingPath, staging)
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return nil, err
	}
	if err := d.releaseStaging(ctx, rec, att); err != nil {
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
	klog.FromContext(ctx).V(2).Info("Unstaged volume", "volumeID", volumeID, "stagingPath", staging, "device", rec.Device)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// releaseStaging unmounts the volume's staging mount before a detach.
// Detaching under a live publication would pull the device from under a
// running pod: the CO must unpublish first. A layer that is not the
// volume's at the staging path refuses the unstage with
// FailedPrecondition naming it; nothing is unmounted then. An unmount of
// a read-write filesystem with no live path would wait in the kernel for
// the paths (stall.go): that is decided before it starts.
func (d *Driver) releaseStaging(ctx context.Context, rec volume.Record, att Attacher) error {
	v, err := d.layers()
	if err != nil {
		return err
	}
	for _, p := range rec.Publications {
		if publishedAt(rec, p, v) {
			return failedPrecondition("volume %s is still published at %s", rec.VolumeID, p.TargetPath)
		}
	}
	c := stagingClaim(rec)
	s := c.inspect(v)
	if s.foreign != nil {
		return foreignError(rec.VolumeID, c, s)
	}
	if _, ok := s.top(); ok {
		if err := d.stallCheckNow(ctx, rec, att, rec.StagingPath, "an unmount"); err != nil {
			return err
		}
	}
	_, err = d.release(ctx, rec.VolumeID, c)
	return err
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

// unmountLayer unmounts layer l (Deps.UnmountLayer) as a kernel call of
// volume volumeID: waited for at most the kernel-call bound, Aborted past
// it (the unmount goes on in the kernel and the volume stays busy until it
// returns).
func (d *Driver) unmountLayer(ctx context.Context, volumeID string, l mounts.Layer) error {
	return d.calls.run(ctx, volumeID, "the unmount of "+l.MountPoint, func() error {
		return d.deps.UnmountLayer(l)
	})
}
