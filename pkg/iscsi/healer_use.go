package iscsi

import (
	"fmt"
	"path"
	"strings"

	"github.com/pathmend/pathmend/pkg/volume"
)

// DeviceUse tells whether a block device is in use on the node: mounted,
// held by a stacked device, its device node bound (a block volume's
// publication). It fails closed: what it cannot read is in use.
// *blockuse.Reader implements it.
type DeviceUse interface {
	InUse(dev string) (inUse bool, why string)
}

// ChooseKick is the heal ladder's structural choice for session s, a
// session of snap that is out of LOGGED_IN: KickRelogin when logging it
// out takes no device in use from its user (every LUN has another live
// path through its multipath map, or nothing on the node and no staged
// volume uses it), else KickRestart. why says which LUN decided and how.
// records are the staged volumes of any transport; only iSCSI ones
// count. use reads the node's own view of each device (nil: no view, and
// a LUN of a target no staged volume uses counts as in use).
//
// It is the choice the SessionHealer makes once s has been down for its
// threshold with the portal continuously reachable. It knows nothing of
// time, reachability, cooldowns, scope or login rejections: those gates
// come before it in the SessionHealer, and a caller without them (a
// one-shot diagnosis) must say so. It reads only its arguments (and,
// through use, the node).
func ChooseKick(snap *Snapshot, s Session, records []volume.Record, use DeviceUse) (k Kick, why string) {
	return chooseKick(snap, s, iscsiRecords(records), true, use)
}

// chooseKick is ChooseKick on iSCSI records; complete is false when some
// staged-volume records could not be read: then an uncovered LUN counts
// as in use, since an unreadable record may be its volume's.
func chooseKick(snap *Snapshot, s Session, recs []volume.Record, complete bool, use DeviceUse) (k Kick, why string) {
	inUse, why := lastPathInUse(snap, s, recs, complete, use)
	if inUse {
		return KickRestart, why
	}
	return KickRelogin, why
}

// lastPathInUse decides whether logging session s out could take a
// device in use away from its user: whether some LUN of s has no other
// live path and is in use. why says which LUN and why, or why a logout
// is safe.
//
// A LUN's device is its dm-multipath map when multipathd holds its disk,
// else the disk itself. A LUN is covered when another disk of its map is
// a live path. An uncovered LUN is in use, in this order, when
//
//   - its device has holders (LVM, kpartx partitions stacked on it);
//   - the node shows it in use (use: mounted, a partition of it mounted or
//     held, its device node bound), or use cannot tell — the same test for
//     every target, whoever staged it;
//   - some staged-volume records could not be read: the unreadable one
//     may be its volume's;
//   - its target is one no staged volume uses and there is no use to ask
//     (pathmend cannot see whether something it did not stage mounts it);
//   - a staged volume of the same target and LUN uses that device. A
//     staged volume uses the device its record names; a record that names
//     nothing, or something this LUN has no name for, counts as using it
//     (when in doubt, do not log out).
//
// What the node cannot show is a plain open of the device node by a
// process (pkg/blockuse): a LUN of another driver's volume that only a
// process holds open, with no mount, holder or bind, reads as unused.
func lastPathInUse(snap *Snapshot, s Session, recs []volume.Record, complete bool, use DeviceUse) (inUse bool, why string) {
	var covered []string
	for _, l := range s.LUNs {
		if l.Disk == "" {
			continue // no disk: nothing a logout could take away
		}
		dev, mapName, other := l.Disk, "", ""
		holders := l.Holders
		if m, ok := snap.MapOf(l.Disk); ok {
			dev, mapName, holders = m.Device, m.Name, m.Holders
			for _, sl := range m.Slaves {
				if sl != l.Disk && snap.Live(sl) {
					other = sl
					break
				}
			}
		}
		if other != "" {
			covered = append(covered, fmt.Sprintf("LUN %d (%s) has another live path %s", l.Address.LUN, dev, other))
			continue
		}
		if len(holders) > 0 {
			return true, fmt.Sprintf("LUN %d: %s has no other live path and is held by %s", l.Address.LUN, dev, strings.Join(holders, ","))
		}
		var nodeWhy string
		if use != nil {
			in, why := use.InUse(dev)
			if in {
				return true, fmt.Sprintf("LUN %d: %s has no other live path and is in use on the node: %s", l.Address.LUN, dev, why)
			}
			nodeWhy = why
		}
		if !complete {
			return true, fmt.Sprintf("LUN %d: %s has no other live path, and some staged-volume records could not be read (cannot tell who uses it)", l.Address.LUN, dev)
		}
		if len(volumesOf(recs, s.TargetName)) == 0 {
			if use == nil {
				return true, fmt.Sprintf("LUN %d: %s has no other live path, and its target is not staged by pathmend (cannot tell who uses it)", l.Address.LUN, dev)
			}
			covered = append(covered, fmt.Sprintf("LUN %d (%s) is not in use: %s", l.Address.LUN, dev, nodeWhy))
			continue
		}
		mine := recordsOfLUN(recs, s.TargetName, l.Address.LUN)
		names := lunDeviceNames(snap, s.TargetName, l)
		for _, r := range mine {
			if recordUses(r.Device, dev, mapName, names) {
				return true, fmt.Sprintf("LUN %d: %s has no other live path and is used by volume %s", l.Address.LUN, dev, r.VolumeID)
			}
		}
		covered = append(covered, fmt.Sprintf("LUN %d (%s) is used by no staged volume", l.Address.LUN, dev))
	}
	if len(covered) == 0 {
		return false, "the session has no disks to lose"
	}
	return false, strings.Join(covered, "; ")
}

// recordsOfLUN returns the staged volumes of target iqn, LUN lun.
func recordsOfLUN(recs []volume.Record, iqn string, lun int) []volume.Record {
	var out []volume.Record
	for _, r := range recs {
		if r.Context.ISCSI.IQN == iqn && r.Context.ISCSI.LUN == lun {
			out = append(out, r)
		}
	}
	return out
}

// lunDeviceNames lists every name the LUN's devices go by on this node:
// its disk on every session to the target and the map over them.
func lunDeviceNames(snap *Snapshot, iqn string, l LUN) map[string]bool {
	names := map[string]bool{}
	for _, s := range snap.SessionsOf(iqn) {
		if x, ok := s.LUN(l.Address.LUN); ok && x.Disk != "" {
			names[x.Disk] = true
			if m, ok := snap.MapOf(x.Disk); ok {
				names[m.Device] = true
			}
		}
	}
	return names
}

// recordUses reports whether a record whose device path is recDevice uses
// dev (the LUN's device on the stuck session: its map or its disk).
// Only a record that clearly names another device of the same LUN (the
// disk of another session, without multipath) does not.
func recordUses(recDevice, dev, mapName string, lunNames map[string]bool) bool {
	if recDevice == "" {
		return true
	}
	name := path.Base(recDevice)
	if strings.HasPrefix(recDevice, "/dev/mapper/") && mapName != "" && name == mapName {
		return true
	}
	if name == dev {
		return true
	}
	return !lunNames[name]
}
