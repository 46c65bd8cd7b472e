package monitor

import (
	"context"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// checkStaged asks the StagedChecker which staged volumes' users hold a
// device the kernel replaced, sets pathmend_volume_staged_device_replaced
// for every staged volume (1 for those, 0 for the others), deletes the
// series of volumes no longer staged, and logs a volume once when it
// becomes replaced. It runs in every heal mode: it reports, it changes
// nothing. It returns the replaced volumes, sorted.
func (m *Monitor) checkStaged(ctx context.Context, recs []volume.Record) []string {
	if m.deps.Staged == nil {
		return nil
	}
	found, err := m.deps.Staged.ReplacedStagings(ctx, recs)
	if err != nil {
		klog.ErrorS(err, "Could not check the staged devices of the staged volumes")
		return nil
	}
	var out []string
	seen := map[string]bool{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		seen[r.VolumeID] = true
		c, replaced := found[r.VolumeID]
		m.deps.Metrics.SetStagedDeviceReplaced(r.VolumeID, string(r.Context.Transport), replaced)
		if replaced {
			out = append(out, r.VolumeID)
			if !m.replaced[r.VolumeID] {
				klog.InfoS("Staged device replaced by the kernel; the volume's pods must be restarted", "volumeID", r.VolumeID, "reason", c.Message)
			}
		}
		m.replaced[r.VolumeID] = replaced
	}
	for id := range m.replaced {
		if !seen[id] {
			m.deps.Metrics.ForgetStagedDevice(id)
			delete(m.replaced, id)
		}
	}
	slices.Sort(out)
	return out
}
