package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/volume"
)

// volumeCondition is the health of one staged volume: its transport's view
// of the paths, and for filesystem access whether the staging mount is
// still there.
func (d *Driver) volumeCondition(ctx context.Context, rec volume.Record) Condition {
	if rec.AccessType == volume.AccessMount {
		if mounted, err := isMountPoint(d.deps.Mounter, rec.StagingPath); err == nil && !mounted {
			return Condition{Status: Inaccessible, Reason: "NotMounted", Message: fmt.Sprintf("filesystem is not mounted at staging path %s", rec.StagingPath)}
		}
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return Condition{Status: Inaccessible, Reason: "UnknownTransport", Message: err.Error()}
	}
	return att.Health(ctx, rec)
}

func healthEntries(c Condition) []*csi.VolumeHealth_VolumeHealthEntry {
	switch c.Status {
	case Degraded:
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: c.Reason, Message: c.Message}}
	case Inaccessible:
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: c.Reason, Message: c.Message}}
	}
	return nil
}

// NodeGetVolumeHealth reports the path health of a staged volume: DEGRADED
// when it runs below its expected paths, INACCESSIBLE when no path is
// usable, no entry when healthy.
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
	for field, p := range map[string]string{"volume_publish_path": req.GetVolumePublishPath(), "staging_target_path": req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		clean, err := checkPath(field, p)
		if err != nil {
			return nil, err
		}
		if _, _, err := d.lookupVolumeAt(volumeID, clean); err != nil {
			return nil, err
		}
	}
	c := d.volumeCondition(ctx, rec)
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: volumeID, HealthStatuses: healthEntries(c)}}, nil
}

// NodeGetStorageHealth reports, per storage backend (an NVMe subsystem or
// an iSCSI target) with a staged volume on this node, whether it is
// degraded or unreachable from here. One entry per (status, reason), its
// message naming the backends and volumes affected.
func (d *Driver) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
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
	for _, rec := range recs {
		c := d.volumeCondition(ctx, rec)
		var st csi.StorageHealthErrorType
		switch c.Status {
		case Degraded:
			st = csi.StorageHealthErrorType_STORAGE_DEGRADED
		case Inaccessible:
			st = csi.StorageHealthErrorType_STORAGE_UNREACHABLE
		default:
			continue
		}
		k := key{st, c.Reason}
		affected[k] = append(affected[k], fmt.Sprintf("%s (volume %s): %s", backendOf(rec.Context), rec.VolumeID, c.Message))
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
			Status: k.status, Reason: k.reason, Message: strings.Join(msgs, "; "),
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
