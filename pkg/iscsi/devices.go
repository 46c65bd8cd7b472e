package iscsi

import (
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// CurrentDevices returns the block devices LUN v.LUN of target v.IQN has
// in snap through the volume's portals — its disk on every session and
// the dm-multipath map over them — with their numbers from
// block/<dev>/dev; nil when it has none. A device whose number cannot be
// read (it vanished since the read) is left out. A LUN whose disk or map
// was deleted and created again (a logout + login of its last path, a
// flushed map) has new numbers.
func CurrentDevices(fsys sysfs.FS, snap *Snapshot, m *PortalMatcher, v *volume.ISCSI) []volume.BlockDevice {
	var names []string
	seen := map[string]bool{}
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	for _, s := range snap.SessionsOf(v.IQN) {
		on := false
		for _, ep := range v.Portals {
			on = on || m.Session(s, v.IQN, ep)
		}
		if !on {
			continue
		}
		if l, ok := s.LUN(v.LUN); ok && l.Disk != "" {
			if mp, ok := snap.MapOf(l.Disk); ok {
				add(mp.Device)
			}
			add(l.Disk)
		}
	}
	var out []volume.BlockDevice
	for _, n := range names {
		s, err := fsys.ReadAttr("block/" + n + "/dev")
		if err != nil {
			continue
		}
		if num, err := volume.ParseDeviceNumber(s); err == nil {
			out = append(out, volume.BlockDevice{Name: n, Number: num})
		}
	}
	return out
}
