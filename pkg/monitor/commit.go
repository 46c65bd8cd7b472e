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
	return m.refreshTarget(ctx, t, nil)
}

// RefreshStaged writes volume rec, staged just now, into the model with
// the other volumes of its target: it reads the target's kernel objects
// only, and the device rec's users hold. A kernel event that names one of
// the volume's objects then finds its target at once — a controller the
// kernel removes cannot be read to learn its subsystem — instead of after
// the next tick, which may be a whole interval away.
func (m *Monitor) RefreshStaged(ctx context.Context, rec volume.Record) error {
	if !m.cfg.Scope.Owned || rec.State != volume.StateStaged {
		return nil
	}
	return m.refreshTarget(ctx, rec.Target(), &rec)
}

func (m *Monitor) refreshTarget(ctx context.Context, t volume.Target, staged *volume.Record) error {
	tr := m.tr[t.Transport]
	if tr == nil {
		return fmt.Errorf("refresh %s: no transport %q", t, t.Transport)
	}
	st := m.deps.Model.Stamp(m.deps.Clock.Now())
	known := m.deps.Model.Snapshot().OfTarget(t)
	recs := make([]volume.Record, 0, len(known)+1)
	for _, v := range known {
		if v.Scope != model.Owned || staged != nil && v.ID == staged.VolumeID {
			continue
		}
		rec, err := m.deps.Intents.Get(v.ID)
		if err != nil {
			continue // unstaged since: the next tick drops it
		}
		recs = append(recs, rec)
	}
	if staged != nil {
		recs = append(recs, *staged)
	}
	vols, err := tr.RefreshTarget(ctx, t, recs)
	if err != nil {
		return fmt.Errorf("refresh %s: %w", t, err)
	}
	if staged != nil && m.deps.Staged != nil {
		held, err := m.deps.Staged([]volume.Record{*staged})
		if err != nil {
			klog.ErrorS(err, "Could not read the staged device of a volume staged just now", "volumeID", staged.VolumeID)
		}
		if h, ok := held[staged.VolumeID]; ok {
			for i := range vols {
				if vols[i].ID == staged.VolumeID && vols[i].Scope == model.Owned {
					vols[i].Held = &h
				}
			}
		}
	}
	m.writeTarget(st, recs, vols, true)
	return nil
}

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
		// The device the volume's users hold: as read just now (a volume
		// staged just now, RefreshStaged), else as the last tick read it
		// (a target read alone reads no mount table).
		if v.Held == nil && had && old.Held != nil {
			v.Held = old.Held
		}
		if v.Held != nil {
			c, rep := m.replacedCondition(*rec, *v.Held, v.Devices)
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
