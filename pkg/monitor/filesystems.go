package monitor

import (
	"maps"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/volume"
)

// checkFilesystems reads the health of every staged filesystem volume's
// filesystem (Deps.Filesystems: the mount table once, then a few sysfs
// attributes and at most one stat per volume; no process, no write),
// sets pathmend_volume_filesystem_state for each, deletes the series of
// volumes no longer staged, and logs a volume at level 0 each time its
// filesystem's state changes: the moment a filesystem stops taking writes
// is the line operators look for. It runs in every heal mode: it reports,
// it changes nothing. It returns the abnormal ones as "volumeID: summary",
// sorted.
func (m *Monitor) checkFilesystems(recs []volume.Record) []string {
	if m.deps.Filesystems == nil {
		return nil
	}
	hs, err := m.deps.Filesystems.FilesystemHealth(recs)
	if err != nil {
		klog.ErrorS(err, "Could not read the health of the staged filesystems")
		return nil
	}
	states := make([]string, len(fshealth.States))
	for i, s := range fshealth.States {
		states[i] = string(s)
	}
	var out []string
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(hs)) {
		h := hs[id]
		m.deps.Metrics.SetFilesystemState(id, string(h.State), states)
		if h.Abnormal() {
			out = append(out, id+": "+h.Summary())
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
	return out
}
