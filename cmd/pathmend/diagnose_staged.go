package main

import (
	"context"
	"fmt"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// kindStagedDeviceReplaced: the block device a staged volume's users hold
// (its staging mount, the device node of its publications) is no longer
// the volume's device — the kernel removed it and created a new one.
// pathmend does not repair it: the pods must be restarted.
const kindStagedDeviceReplaced heal.Kind = volume.ReasonStagedDeviceReplaced

// stagedDeviceDefects compares each staged volume's staged device (found
// in mounts and at its publications) with the devices its namespace or
// LUN has in this read, by device number, and returns a
// StagedDeviceReplaced defect, with its plan entry, for each one whose
// staged device is not among them.
func stagedDeviceDefects(ctx context.Context, sys sysfs.FS, h *nvme.Host, snap *iscsi.Snapshot, recs []volume.Record, mounts []volume.Mount) ([]heal.Defect, []planRep) {
	m := iscsi.NewPortalMatcher(ctx, nil)
	var defects []heal.Defect
	var plan []planRep
	for _, rec := range recs {
		var current []volume.BlockDevice
		switch {
		case rec.Context.NVMe != nil:
			if e, ok := nvme.ExpectationFromRecord(rec); ok {
				current = nvme.CurrentDevices(sys, h, e)
			}
		case rec.Context.ISCSI != nil:
			current = iscsi.CurrentDevices(sys, snap, m, rec.Context.ISCSI)
		}
		staged, ok := volume.FindStagedDevice(rec, mounts, volume.NodeNumber)
		if !ok {
			continue
		}
		_, err := sys.Stat("dev/block/" + staged.Device.Number.String())
		c, replaced := volume.Replaced(rec, staged, current, err != nil)
		if !replaced {
			continue
		}
		d := heal.Defect{Kind: kindStagedDeviceReplaced, Scope: heal.ScopeController, Key: rec.VolumeID,
			Subject:  fmt.Sprintf("volume %s on %s, not one of %s", rec.VolumeID, staged.Device, devicesString(current)),
			Teardown: []heal.Path{}, Volumes: []string{rec.VolumeID}, Detail: c.Message}
		defects = append(defects, d)
		plan = append(plan, planRep{Kind: d.Kind, Scope: d.Scope, Key: d.Key, Verdict: heal.Refused,
			Reason: "no automatic repair: restart the pods that use the volume; the next NodeStage stages it on its current device"})
	}
	return defects, plan
}

func devicesString(ds []volume.BlockDevice) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += ", "
		}
		s += d.String()
	}
	return s
}

// filesystemDefects reads the health of each staged filesystem volume's
// filesystem (pkg/fshealth, as the monitor does every tick) and returns a
// defect, kind FilesystemReadOnly, FilesystemShutdown or FilesystemErrors,
// with its plan entry, for each that is not healthy. pathmend repairs none
// of them in place: the pods must be restarted, and the next NodeStage
// checks the filesystem before it mounts it.
func filesystemDefects(r *fshealth.Reader, recs []volume.Record, infos []mount.MountInfo) ([]heal.Defect, []planRep) {
	var defects []heal.Defect
	var plan []planRep
	for _, rec := range recs {
		if rec.State != volume.StateStaged || rec.AccessType != volume.AccessMount {
			continue
		}
		h := r.Check(rec, infos)
		if !h.Abnormal() {
			continue
		}
		c := h.Condition()
		d := heal.Defect{Kind: heal.Kind(c.Reason), Scope: heal.ScopeController, Key: rec.VolumeID,
			Subject:  fmt.Sprintf("volume %s: %s", rec.VolumeID, h.Summary()),
			Teardown: []heal.Path{}, Volumes: []string{rec.VolumeID}, Detail: c.Message}
		defects = append(defects, d)
		plan = append(plan, planRep{Kind: d.Kind, Scope: d.Scope, Key: d.Key, Verdict: heal.Refused,
			Reason: "no automatic repair: pathmend never remounts a filesystem read-write in place; restart the pods that use the volume, and the next NodeStage checks it before mounting it"})
	}
	return defects, plan
}
