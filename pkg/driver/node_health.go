package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/volume"
)

// reasonNotMounted: a filesystem volume's staging mount is gone.
const reasonNotMounted = "NotMounted"

// volumeHealth is what the health RPCs know of one volume with a record:
// its condition (its paths graded, or a device the kernel replaced under
// its users, or a staging mount that is gone), the loop's notes about it,
// the model's view of its paths, and the facts other packages added (its
// filesystem's health, fshealth.Fact). It comes from the node model when
// the volume's entry there was read at most Config.HealthBound ago (and
// not before the volume was staged as it is now); else from a read of the
// volume's own kernel objects only (its transport's Health: its
// subsystem, or its target's sessions), the mount table and its own
// filesystem's attributes, never the whole node. That read is not written
// into the model: the loop is its writer, and the next tick does. mc is
// the mount table of the call, read at most once however many volumes it
// answers for.
func (d *Driver) volumeHealth(ctx context.Context, rec volume.Record, mc *mountCache) model.Volume {
	if rec.AccessType == volume.AccessMount {
		if mounted, err := isMountPoint(d.deps.Mounter, rec.StagingPath); err == nil && !mounted {
			return model.Volume{Condition: volume.Condition{Status: volume.Inaccessible, Reason: reasonNotMounted, Message: fmt.Sprintf("filesystem is not mounted at staging path %s", rec.StagingPath)}}
		}
	}
	entry, fresh := d.modelEntry(rec)
	if fresh {
		return entry
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return model.Volume{Condition: volume.Condition{Status: volume.Inaccessible, Reason: "UnknownTransport", Message: err.Error()}}
	}
	now := d.deps.Clock.Now()
	c := att.Health(ctx, rec)
	mt := mc.get(d)
	if mt.err == nil {
		if r, ok := d.replacedCondition(rec, mt.mounts, c); ok {
			c = r
		}
	}
	facts := entry.Facts
	if h, ok := d.filesystemHealth(rec, mt); ok {
		facts = maps.Clone(facts)
		if facts == nil {
			facts = map[string]model.Fact{}
		}
		facts[fshealth.Fact] = model.Fact{Condition: h.Condition(), ReadAt: now}
	}
	return model.Volume{Condition: c, Notes: entry.Notes, Facts: facts, Paths: entry.Paths}
}

// modelEntry returns the node model's entry of rec's volume, its facts
// limited to those read since the volume was staged as it is now, and
// whether the entry is within Config.HealthBound. An entry of another
// staging (read before this one: a restage onto the device that replaced
// the old one) is none.
func (d *Driver) modelEntry(rec volume.Record) (entry model.Volume, fresh bool) {
	if d.deps.Model == nil {
		return model.Volume{}, false
	}
	e, ok := d.deps.Model.Snapshot().Volume(rec.VolumeID)
	if !ok || e.Scope != model.Owned || e.Target != rec.Target() || e.ReadAt.Before(rec.StagedAt) {
		return model.Volume{}, false
	}
	// A fact read before this staging (the filesystem the restage
	// checked and mounted again) is not this staging's.
	before := func(_ string, f model.Fact) bool { return f.ReadAt.Before(rec.StagedAt) }
	for name, f := range e.Facts {
		if before(name, f) {
			e.Facts = maps.Clone(e.Facts)
			maps.DeleteFunc(e.Facts, before)
			break
		}
	}
	return e, d.cfg.HealthBound > 0 && e.Age(d.deps.Clock.Now()) <= d.cfg.HealthBound
}

// filesystemHealth reads the health of a staged filesystem volume's
// filesystem (pkg/fshealth); ok is false for a block volume, a volume
// that is not staged, or when the mount table cannot be read.
func (d *Driver) filesystemHealth(rec volume.Record, mt mountTable) (fshealth.Health, bool) {
	if rec.AccessType != volume.AccessMount || rec.State != volume.StateStaged || mt.err != nil || d.deps.Filesystems == nil {
		return fshealth.Health{}, false
	}
	return d.deps.Filesystems.Check(rec, mt.infos), true
}

// filesystemFact returns the health of rec's filesystem as v has it (the
// fact the loop or volumeHealth read), and whether v has one.
func filesystemFact(v model.Volume) (volume.Condition, bool) {
	f, ok := v.Facts[fshealth.Fact]
	return f.Condition, ok
}

// mountTable is the mount table as one call reads it: every mount with
// its device number and options (infos), the same as volume.Mounts
// (mounts), or why it could not be read.
type mountTable struct {
	infos  []mount.MountInfo
	mounts []volume.Mount
	err    error
}

// readMountTable reads the mount table (Deps.MountTable). What is
// derived from it is kept with the table it was derived from: on a quiet
// node a call finds both unchanged.
func (d *Driver) readMountTable() mountTable {
	tb, err := d.deps.MountTable()
	if err != nil {
		return mountTable{err: err}
	}
	if c := d.derived.Load(); c != nil && c.tb == tb {
		return c.mt
	}
	mt := mountTable{infos: tb.Infos(), mounts: MountsOf(tb.Infos())}
	d.derived.Store(&derivedTable{tb: tb, mt: mt})
	return mt
}

// derivedTable is a mount table and what readMountTable derived from it.
type derivedTable struct {
	tb *mounts.Table
	mt mountTable
}

// mountCache is the mount table as one RPC reads it: at the first volume
// that needs it, and once (NodeGetStorageHealth answers for every volume).
type mountCache struct{ t *mountTable }

func (c *mountCache) get(d *Driver) mountTable {
	if c.t == nil {
		t := d.readMountTable()
		c.t = &t
	}
	return *c.t
}

// healthEntries are the entries of conditions cs, one per abnormal one.
func healthEntries(cs []volume.Condition) []*csi.VolumeHealth_VolumeHealthEntry {
	var out []*csi.VolumeHealth_VolumeHealthEntry
	for _, c := range cs {
		msg := boundMessage(c.Message, maxHealthMessageBytes)
		switch c.Status {
		case volume.Degraded:
			out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: c.Reason, Message: msg})
		case volume.Inaccessible:
			out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: c.Reason, Message: msg})
		}
	}
	return out
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
	v := d.volumeHealth(ctx, rec, &mountCache{})
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: volumeID, HealthStatuses: healthEntries(v.Conditions())}}, nil
}

// Reasons of the node conditions NodeGetStorageHealth reports itself (the
// transports add theirs to the node model).
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
// the node model, as the loop's last tick wrote them); staged-volume records
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
		if !c.Abnormal() {
			return
		}
		k := key{storageStatus(c.Status), c.Reason}
		affected[k] = append(affected[k], msg)
	}
	mc := &mountCache{}
	fsVolumes := map[key][]string{}
	for _, rec := range recs {
		for _, c := range d.volumeHealth(ctx, rec, mc).Conditions() {
			if isFilesystemReason(c.Reason) {
				// Counted per node: one message per reason naming how
				// many volumes (fsSummary); each volume's own message
				// (NodeGetVolumeHealth, the pod's status) names its
				// device and errors.
				k := key{storageStatus(c.Status), c.Reason}
				fsVolumes[k] = append(fsVolumes[k], rec.VolumeID)
				continue
			}
			add(c, fmt.Sprintf("%s (volume %s): %s", backendOf(rec.Context), rec.VolumeID, c.Message))
		}
	}
	for k, ids := range fsVolumes {
		affected[k] = append(affected[k], fsSummary(k.reason, ids))
	}
	if err := l.Err(); err != nil {
		add(volume.Condition{Status: volume.Degraded, Reason: ReasonRecordsUnreadable}, fmt.Sprintf("%d staged-volume record(s) cannot be read, so their volumes are neither checked nor healed and nothing of their targets is torn down: %v; see pathmend diagnose and docs/state.md (an unreadable record)", len(l.Unreadable), err))
	}
	if d.cfg.HealMode == heal.ModeOff {
		add(volume.Condition{Status: volume.Degraded, Reason: ReasonHealOff}, "path healing is off on this node (--heal=off): pathmend neither reconnects nor repairs paths, and a path lost stays lost; run pathmend with --heal=repair, or --heal=observe to see what it would do")
	}
	if d.deps.Model != nil {
		for _, c := range d.deps.Model.Snapshot().Node() {
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

// storageStatus is the storage health status of an abnormal condition's
// status: Degraded → STORAGE_DEGRADED, Inaccessible → STORAGE_UNREACHABLE.
func storageStatus(s volume.HealthStatus) csi.StorageHealthErrorType {
	if s == volume.Inaccessible {
		return csi.StorageHealthErrorType_STORAGE_UNREACHABLE
	}
	return csi.StorageHealthErrorType_STORAGE_DEGRADED
}

// isFilesystemReason reports whether reason is one of a filesystem's
// conditions (pkg/fshealth), which NodeGetStorageHealth counts per node.
func isFilesystemReason(reason string) bool {
	switch reason {
	case fshealth.ReasonReadOnly, fshealth.ReasonShutdown, fshealth.ReasonErrors:
		return true
	}
	return false
}

// fsSummary is NodeGetStorageHealth's message for the volumes whose
// filesystems have one condition: how many, which, and what to do; each
// volume's own message (NodeGetVolumeHealth, the pod's status) names its
// device, errors and times. E.g. "the filesystems of 2 volumes are
// read-only after errors, every write fails: vol-a, vol-b; restart …".
func fsSummary(reason string, ids []string) string {
	sort.Strings(ids)
	what := map[string]string{
		fshealth.ReasonReadOnly: "read-only after errors, every write fails",
		fshealth.ReasonShutdown: "shut down, every read and write fails",
		fshealth.ReasonErrors:   "writable with errors recorded, their metadata may be damaged",
	}[reason]
	head := fmt.Sprintf("the filesystem of 1 volume is %s: ", what)
	if len(ids) != 1 {
		head = fmt.Sprintf("the filesystems of %d volumes are %s: ", len(ids), what)
	}
	const todo = "; restart their pods, so that NodeUnstage and the next NodeStage check and mount them again (NodeGetVolumeHealth of each names its device and errors; docs/operations.md)"
	list := strings.Join(ids, ", ")
	if room := maxHealthMessageBytes - len(head) - len(todo); len(list) > room {
		list = boundMessage(list, room)
	}
	return head + list + todo
}

// FilesystemHealth reads the health of the filesystem of each staged
// filesystem volume in recs, reading the mount table once; block volumes
// are left out. The loop (pkg/monitor) calls it once a tick: it writes
// each volume's health into the node model (fact fshealth.Fact), which
// the health RPCs read, and sets pathmend_volume_filesystem_state.
func (d *Driver) FilesystemHealth(recs []volume.Record) (map[string]fshealth.Health, error) {
	mt := d.readMountTable()
	if mt.err != nil {
		return nil, mt.err
	}
	out := make(map[string]fshealth.Health, len(recs))
	for _, rec := range recs {
		if h, ok := d.filesystemHealth(rec, mt); ok {
			out[rec.VolumeID] = h
		}
	}
	return out, nil
}
