package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// volumeCondition is the health of one staged volume: its transport's view
// of the paths, for filesystem access whether the staging mount is still
// there, and whether what its users hold is still its device (a device
// the kernel removed and re-created makes a staged volume inaccessible
// however healthy its paths are).
func (d *Driver) volumeCondition(ctx context.Context, rec volume.Record) volume.Condition {
	if rec.AccessType == volume.AccessMount {
		if mounted, err := isMountPoint(d.deps.Mounter, rec.StagingPath); err == nil && !mounted {
			return volume.Condition{Status: volume.Inaccessible, Reason: "NotMounted", Message: fmt.Sprintf("filesystem is not mounted at staging path %s", rec.StagingPath)}
		}
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: "UnknownTransport", Message: err.Error()}
	}
	c := att.Health(ctx, rec)
	if mounts, err := d.mounts(); err == nil {
		if r, ok := d.replacedCondition(rec, mounts, c); ok {
			return r
		}
	}
	return c
}

func healthEntries(c volume.Condition) []*csi.VolumeHealth_VolumeHealthEntry {
	msg := boundMessage(c.Message, maxHealthMessageBytes)
	switch c.Status {
	case volume.Degraded:
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: c.Reason, Message: msg}}
	case volume.Inaccessible:
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: c.Reason, Message: msg}}
	}
	return nil
}

// NodeGetVolumeHealth reports the path health of a staged volume: DEGRADED
// when it runs below its expected paths, INACCESSIBLE when no path is
// usable, no entry when healthy. The volume is the one volume_id names;
// NotFound means it is not staged on this node.
func (d *Driver) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	volumeID := req.GetVolumeId()
	if volumeID == "" {
		return nil, invalidArgument("volume_id is required")
	}
	rec, err := d.deps.Intents.Get(volumeID)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return nil, notFound("volume %s is not staged on this node", volumeID)
	case err != nil:
		return nil, internal(err, "read record of volume %s", volumeID)
	}
	// The paths say where the caller sees the volume; they do not select
	// it, so they are checked for form only. The spec answers NOT_FOUND
	// only for a volume that does not exist on the node, and kubelet's
	// volume health manager sends, for a raw block volume, its own global
	// map directory (plugins/kubernetes.io/csi/volumeDevices/<pv>/dev) as
	// staging_target_path and no publish path: a lookup by path would
	// hide the health of every block volume from kubelet.
	for field, p := range map[string]string{"volume_publish_path": req.GetVolumePublishPath(), "staging_target_path": req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		if _, err := checkPath(field, p); err != nil {
			return nil, err
		}
	}
	c := d.volumeCondition(ctx, rec)
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: volumeID, HealthStatuses: healthEntries(c)}}, nil
}

// Reasons of the node conditions NodeGetStorageHealth reports itself (the
// monitor and the session heal add theirs through Deps.NodeConditions).
const (
	// ReasonRecordsUnreadable: some staged-volume records cannot be read;
	// their volumes are neither checked nor healed.
	ReasonRecordsUnreadable = "RecordsUnreadable"
	// ReasonHealOff: path healing is switched off on this node.
	ReasonHealOff = "HealOff"
)

// NodeGetStorageHealth reports the node's storage conditions: per storage
// backend (an NVMe subsystem or an iSCSI target) with a staged volume on
// this node, whether it is degraded or unreachable from here; targets or
// portals that do not answer and iSCSI sessions the heal cannot kick (from
// Deps.NodeConditions: the monitor's last tick); staged-volume records
// that cannot be read; and the heal switched off. One entry per (status,
// reason), its message naming what is affected and what to do (within
// the 1024 bytes Kubernetes keeps: the entries that do not fit are
// counted); no entry when none of this holds (healthy).
func (d *Driver) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	// Unreadable records are a condition of the node, not a failure of
	// the call: the readable ones are still reported.
	l, err := d.deps.Intents.Scan()
	if err != nil {
		return nil, internal(err, "list staged volumes")
	}
	recs := l.Records
	type key struct {
		status csi.StorageHealthErrorType
		reason string
	}
	affected := map[key][]string{}
	add := func(c volume.Condition, msg string) {
		var st csi.StorageHealthErrorType
		switch c.Status {
		case volume.Degraded:
			st = csi.StorageHealthErrorType_STORAGE_DEGRADED
		case volume.Inaccessible:
			st = csi.StorageHealthErrorType_STORAGE_UNREACHABLE
		default:
			return
		}
		k := key{st, c.Reason}
		affected[k] = append(affected[k], msg)
	}
	for _, rec := range recs {
		c := d.volumeCondition(ctx, rec)
		add(c, fmt.Sprintf("%s (volume %s): %s", backendOf(rec.Context), rec.VolumeID, c.Message))
	}
	if err := l.Err(); err != nil {
		add(volume.Condition{Status: volume.Degraded, Reason: ReasonRecordsUnreadable}, fmt.Sprintf("%d staged-volume record(s) cannot be read, so their volumes are neither checked nor healed and nothing of their targets is torn down: %v; see pathmend diagnose and docs/state.md (an unreadable record)", len(l.Unreadable), err))
	}
	if d.cfg.HealMode == heal.ModeOff {
		add(volume.Condition{Status: volume.Degraded, Reason: ReasonHealOff}, "path healing is off on this node (--heal=off): pathmend neither reconnects nor repairs paths, and a path lost stays lost; run pathmend with --heal=repair, or --heal=observe to see what it would do")
	}
	if d.deps.NodeConditions != nil {
		for _, c := range d.deps.NodeConditions() {
			add(c, c.Message)
		}
	}
	keys := make([]key, 0, len(affected))
	for k := range affected {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].status != keys[j].status {
			return keys[i].status < keys[j].status
		}
		return keys[i].reason < keys[j].reason
	})
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, k := range keys {
		msgs := affected[k]
		sort.Strings(msgs)
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: k.status, Reason: k.reason, Message: joinBounded(msgs),
		})
	}
	return resp, nil
}

// backendOf names the storage backend of a volume: its subsystem NQN or
// its target IQN.
func backendOf(c volume.Context) string {
	switch {
	case c.NVMe != nil:
		return c.NVMe.NQN
	case c.ISCSI != nil:
		return c.ISCSI.IQN
	}
	return string(c.Transport)
}
