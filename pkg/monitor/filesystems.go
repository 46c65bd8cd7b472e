package monitor

import (
	"maps"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/volume"
)

// FilesystemReader reads the health of the filesystems of staged volumes
// in recs, by volume ID, reading the mount table once for all of them; a
// block volume is left out. The driver reads it (it knows the mounts).
type FilesystemReader func(recs []volume.Record) (map[string]fshealth.Health, error)

// filesystems is one tick's read of the staged filesystems.
type filesystems struct {
	// health is each staged filesystem volume's, by volume ID; nil when
	// the read failed (the model keeps what it had).
	health map[string]fshealth.Health
	// at is when the read began: the ReadAt of the facts it writes.
	at time.Time
}

// readFilesystems reads the health of every staged filesystem volume's
// filesystem (Deps.Filesystems: the mount table once, then a few sysfs
// attributes and at most one stat per volume; no process, no write),
// sets pathmend_volume_filesystem_state for each, deletes the series of
// volumes no longer staged, and logs a volume at level 0 each time its
// filesystem's state changes: the moment a filesystem stops taking writes
// is the line operators look for. It runs in every heal mode: it reports,
// it changes nothing. It returns the read, and the abnormal filesystems
// as "volumeID: summary", sorted.
func (m *Monitor) readFilesystems(staged []volume.Record) (filesystems, []string) {
	if m.deps.Filesystems == nil {
		return filesystems{}, nil
	}
	at := m.deps.Clock.Now()
	hs, err := m.deps.Filesystems(staged)
	if err != nil {
		klog.ErrorS(err, "Could not read the health of the staged filesystems")
		return filesystems{}, nil
	}
	states := make([]string, len(fshealth.States))
	for i, s := range fshealth.States {
		states[i] = string(s)
	}
	var abnormal []string
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(hs)) {
		h := hs[id]
		m.deps.Metrics.SetFilesystemState(id, string(h.State), states)
		if h.Abnormal() {
			abnormal = append(abnormal, id+": "+h.Summary())
		}
		prev, seen := m.filesystems[id]
		switch {
		case h.Abnormal() && prev != h.State:
			c := h.Condition()
			klog.InfoS("Staged filesystem is not healthy", "volumeID", id, "state", h.State, "reason", c.Reason, "device", h.Device, "errors", h.Errors, "detail", c.Message)
		case seen && prev != h.State && (prev == fshealth.Errors || prev == fshealth.ReadOnly || prev == fshealth.Shutdown):
			klog.InfoS("Staged filesystem is no longer reported unhealthy", "volumeID", id, "state", h.State, "was", prev, "device", h.Device)
		}
		m.filesystems[id] = h.State
	}
	for id := range m.filesystems {
		if _, ok := hs[id]; !ok {
			m.deps.Metrics.ForgetFilesystem(id)
			delete(m.filesystems, id)
		}
	}
	return filesystems{health: hs, at: at}, abnormal
}

// write sets, in the model, the filesystem fact of every staged volume
// the read covered: its condition when abnormal (read-only, shut down,
// errors recorded), none when healthy or unknown. A failed read writes
// nothing. A healthy node writes nothing new: only an abnormal
// filesystem's fact changes with every read.
func (f filesystems) write(tx *model.Txn, staged []volume.Record) {
	if f.health == nil {
		return
	}
	for _, rec := range staged {
		h, ok := f.health[rec.VolumeID]
		if ok && h.Abnormal() {
			tx.SetFact(rec.VolumeID, fshealth.Fact, model.Fact{Condition: h.Condition(), ReadAt: f.at})
			continue
		}
		tx.ClearFact(rec.VolumeID, fshealth.Fact)
	}
}
