package monitor

import (
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// checkStaged compares the device each staged volume's users hold (from
// Deps.Staged: the mount table and block publications) with the devices
// the volume has now — its namespace's in host, this tick's NVMe read,
// and its LUN's in the session heal's read — by device number. It sets
// pathmend_volume_staged_device_replaced for every staged volume (1 when
// the staged device is not among them: the kernel removed it and made a
// new one; 0 otherwise), deletes the series of volumes no longer staged,
// and logs a volume once when it becomes replaced. It reads no sysfs
// beyond the number of a replaced device, so a tick costs what it did. It
// runs in every heal mode: it reports, it changes nothing. It returns the
// replaced volumes, sorted.
func (m *Monitor) checkStaged(recs []volume.Record, host *nvme.Host) []string {
	if m.deps.Staged == nil {
		return nil
	}
	staged, err := m.deps.Staged.StagedDevices(recs)
	if err != nil {
		klog.ErrorS(err, "Could not read the staged devices of the staged volumes")
		return nil
	}
	current := map[string][]volume.BlockDevice{}
	if sd, ok := m.deps.Sessions.(SessionDevices); ok {
		current = sd.CurrentDevices(recs)
	}
	for _, r := range recs {
		if e, ok := nvme.ExpectationFromRecord(r); ok && host != nil {
			current[r.VolumeID] = nvme.CurrentDevices(m.deps.SysFS, host, e)
		}
	}
	var out []string
	seen := map[string]bool{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		seen[r.VolumeID] = true
		s, known := staged[r.VolumeID]
		_, replaced := volume.Replaced(r, s, current[r.VolumeID], false)
		replaced = replaced && known
		m.deps.Metrics.SetStagedDeviceReplaced(r.VolumeID, string(r.Context.Transport), replaced)
		if replaced {
			out = append(out, r.VolumeID)
			if !m.replaced[r.VolumeID] {
				_, err := m.deps.SysFS.Stat("dev/block/" + s.Device.Number.String())
				c, _ := volume.Replaced(r, s, current[r.VolumeID], err != nil)
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

// stagedRecords returns the records of recs whose state is staged: an
// attaching volume has no staged device yet, a detaching one is going.
func stagedRecords(recs []volume.Record) []volume.Record {
	var out []volume.Record
	for _, r := range recs {
		if r.State == volume.StateStaged {
			out = append(out, r)
		}
	}
	return out
}
