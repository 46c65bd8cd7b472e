package monitor

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/volume"
)

// commit writes one tick into the model and the metrics: every volume the
// transports reported, with the device its users hold (Deps.Staged: the
// mount table, read once) and, when that is not one of the devices the
// volume has now, the condition that says the kernel replaced it; the
// node's conditions by transport; the end of the tick. Entries the tick
// did not write (unstaged volumes, forgotten targets) leave the model,
// unless a later read wrote them; each staged filesystem's health, read
// after the transports' reports (readFilesystems), as the volume's
// filesystem fact. It returns the replaced volumes and the abnormal
// filesystems, sorted.
//
// The staged-device check reads no sysfs beyond the number of a replaced
// device, and runs in every heal mode: it reports, it changes nothing.
func (m *Monitor) commit(r model.Round, vols []model.Volume, node map[string][]volume.Condition) (replaced, abnormalFS []string) {
	byID := make(map[string]*volume.Record, len(r.Listing.Records))
	staged := r.Listing.Records // when every record is staged, as on a steady node
	for i := range r.Listing.Records {
		if rec := &r.Listing.Records[i]; rec.State == volume.StateStaged {
			byID[rec.VolumeID] = rec
		}
	}
	if len(byID) != len(staged) {
		staged = make([]volume.Record, 0, len(byID))
		for _, rec := range r.Listing.Records {
			if rec.State == volume.StateStaged {
				staged = append(staged, rec)
			}
		}
	}
	held := map[string]volume.StagedDevice{}
	if m.deps.Staged != nil && len(staged) > 0 {
		h, err := m.deps.Staged(staged)
		if err != nil {
			klog.ErrorS(err, "Could not read the staged devices of the staged volumes")
		}
		held = h
	}
	fs, abnormalFS := m.readFilesystems(staged)
	seen := make(map[string]bool, len(vols))
	prev := m.deps.Model.Snapshot()
	m.mu.Lock()
	for i := range vols {
		v := &vols[i]
		if v.Scope != model.Owned {
			continue
		}
		seen[v.ID] = true
		rec, ok := byID[v.ID]
		if !ok {
			continue
		}
		if s, ok := held[v.ID]; ok {
			// The held device the model has, when it is the same: a
			// steady tick allocates nothing for it.
			if p, ok := prev.Volume(v.ID); ok && p.Held != nil && *p.Held == s {
				v.Held = p.Held
			} else {
				v.Held = &s
			}
			if c, rep := m.replacedCondition(*rec, s, v.Devices); rep {
				v.Condition = c
				replaced = append(replaced, v.ID)
				if !m.replaced[v.ID] {
					klog.InfoS("Staged device replaced by the kernel; the volume's pods must be restarted", "volumeID", v.ID, "reason", c.Message)
				}
			}
		}
		live, opt := v.Live()
		m.deps.Metrics.SetVolumePaths(v.ID, string(rec.Context.Transport), len(v.Paths), live, opt)
	}
	var rep map[string]bool
	for _, id := range replaced {
		if rep == nil {
			rep = map[string]bool{}
		}
		rep[id] = true
	}
	for _, rec := range staged {
		m.deps.Metrics.SetStagedDeviceReplaced(rec.VolumeID, string(rec.Context.Transport), rep[rec.VolumeID])
	}
	for id := range m.replaced {
		if _, ok := byID[id]; !ok {
			m.deps.Metrics.ForgetStagedDevice(id)
			delete(m.replaced, id)
		}
	}
	for _, rec := range staged {
		m.replaced[rec.VolumeID] = rep[rec.VolumeID]
	}
	for id := range m.paths {
		if !seen[id] {
			m.deps.Metrics.ForgetVolume(id)
		}
	}
	m.paths = seen
	m.mu.Unlock()

	end := m.deps.Clock.Now()
	m.deps.Model.Update(func(tx *model.Txn) {
		for _, v := range vols {
			tx.Put(r.Stamp, v)
		}
		tx.Sweep(r.Stamp, func(model.Volume) bool { return false })
		fs.write(tx, staged)
		for src, conds := range node {
			tx.SetNode(src, conds)
		}
		tx.Ticked(end, r.Stamp.At)
	})
	m.deps.Metrics.ObserveTick(end.Sub(r.Stamp.At), end)
	slices.Sort(replaced)
	return replaced, abnormalFS
}

// replacedCondition returns the condition of staged volume rec whose users
// hold s when s is not one of the devices current: the kernel removed it
// and made a new one. ok is false when it is one, or when the volume has
// no device now (its paths' condition says why).
func (m *Monitor) replacedCondition(rec volume.Record, s volume.StagedDevice, current []volume.BlockDevice) (volume.Condition, bool) {
	if _, rep := volume.Replaced(rec, s, current, false); !rep {
		return volume.Condition{}, false
	}
	// sysfs lists every registered block device number under dev/block.
	removed := false
	if m.deps.SysFS.Root() != "" {
		_, err := m.deps.SysFS.Stat("dev/block/" + s.Device.Number.String())
		removed = err != nil
	}
	return volume.Replaced(rec, s, current, removed)
}

var _ model.Refresher = (*Monitor)(nil)

// RefreshTarget reads the kernel objects of target t only, through its
// transport, and writes what it read of the target's staged volumes that
// the model has (a volume staged since the last tick is the next tick's)
// into the model, keeping what their users hold. It implements
// model.Refresher: a kernel event names the object, the model its target.
// Its write never replaces a read that began later.
func (m *Monitor) RefreshTarget(ctx context.Context, t volume.Target) error {
	tr := m.tr[t.Transport]
	if tr == nil {
		return fmt.Errorf("refresh %s: no transport %q", t, t.Transport)
	}
	st := m.deps.Model.Stamp(m.deps.Clock.Now())
	known := m.deps.Model.Snapshot().OfTarget(t)
	recs := make([]volume.Record, 0, len(known))
	for _, v := range known {
		if v.Scope != model.Owned {
			continue
		}
		rec, err := m.deps.Intents.Get(v.ID)
		if err != nil {
			continue // unstaged since: the next tick drops it
		}
		recs = append(recs, rec)
	}
	vols, err := tr.RefreshTarget(ctx, t, recs)
	if err != nil {
		return fmt.Errorf("refresh %s: %w", t, err)
	}
	m.writeTarget(st, recs, vols, true)
	return nil
}

// writeTarget writes what a read of one target, stamped st, found of its
// volumes vols into the model (recs are the records of its staged
// volumes): each staged volume keeps the device its users hold as the
// model has it (the tick reads the mount table), compared with the
// devices the volume has now — a replacement is logged once and counted,
// as the tick does — and, with keepNotes (a read that decided nothing),
// the notes the model has. The metrics of the volumes' paths follow.
func (m *Monitor) writeTarget(st model.Stamp, recs []volume.Record, vols []model.Volume, keepNotes bool) {
	prev := m.deps.Model.Snapshot()
	byID := make(map[string]*volume.Record, len(recs))
	for i := range recs {
		byID[recs[i].VolumeID] = &recs[i]
	}
	m.mu.Lock()
	for i := range vols {
		v := &vols[i]
		old, had := prev.Volume(v.ID)
		if keepNotes && had {
			v.Notes = old.Notes
		}
		rec := byID[v.ID]
		if v.Scope != model.Owned || rec == nil {
			continue
		}
		tr := string(rec.Context.Transport)
		if had && old.Held != nil {
			v.Held = old.Held
			c, rep := m.replacedCondition(*rec, *old.Held, v.Devices)
			if rep {
				v.Condition = c
				if !m.replaced[v.ID] {
					klog.InfoS("Staged device replaced by the kernel; the volume's pods must be restarted", "volumeID", v.ID, "reason", c.Message)
				}
			}
			m.replaced[v.ID] = rep
			m.deps.Metrics.SetStagedDeviceReplaced(v.ID, tr, rep)
		}
		live, opt := v.Live()
		m.deps.Metrics.SetVolumePaths(v.ID, tr, len(v.Paths), live, opt)
		m.paths[v.ID] = true
	}
	m.mu.Unlock()
	m.deps.Model.Update(func(tx *model.Txn) {
		for _, v := range vols {
			tx.Put(st, v)
		}
	})
}
