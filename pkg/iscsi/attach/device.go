package attach

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// lunPath is one session's disk of the volume's LUN.
type lunPath struct {
	session iscsi.Session
	lun     iscsi.LUN
}

func (p lunPath) String() string {
	return fmt.Sprintf("%s (%s) %s", p.session.ID, p.session.PortalString(), p.lun.Disk)
}

// findDevice waits for the LUN's disk on every logged-in session, verifies
// that the disks are one LUN, and returns the multipath map over them or,
// without one, a single disk.
func (a *Attacher) findDevice(ctx context.Context, v *volume.ISCSI, loggedIn []iscsi.Node) (volume.Device, error) {
	paths, err := a.waitDisks(ctx, v, loggedIn)
	if err != nil {
		return volume.Device{}, err
	}
	wwid, size, err := verifyPaths(v, paths)
	if err != nil {
		return volume.Device{}, err
	}
	if wwid == "" {
		klog.FromContext(ctx).Info("Cannot verify the LUN's WWID; verifying the device by size only", "iqn", v.IQN, "lun", v.LUN, "paths", describe(paths),
			"reason", "the kernel publishes no WWID for the LUN on any path: each has an empty wwid attribute, or none and no vpd_pg83 page")
	}
	m, found, err := a.waitMap(ctx, v, wwid, paths)
	if err != nil {
		return volume.Device{}, err
	}
	// Without a map the first portal's disk is the device, and the volume
	// works on one path; Health reports the portals as they are. Nothing
	// holds the disk open until it is mounted, so a map multipathd
	// assembles later may still take it: the driver asks CheckDevice
	// again before it formats, mounts or records the device.
	name := paths[0].lun.Disk
	if found {
		// A map of another size is not a map over these disks as they
		// are (an earlier LUN's, or one not resized after the LUN was).
		if m.SizeBytes != size {
			return volume.Device{}, fmt.Errorf("multipath map %s (%s) of %s LUN %d has %d bytes, its path %s has %d", m.Device, m.Name, v.IQN, v.LUN, m.SizeBytes, paths[0].lun.Disk, size)
		}
		name, size = m.Device, m.SizeBytes
	} else if len(paths) > 1 {
		klog.FromContext(ctx).Info("No multipath map over the paths of the LUN; using one path", "iqn", v.IQN, "lun", v.LUN, "paths", describe(paths), "device", name)
	}
	if size <= 0 {
		return volume.Device{}, fmt.Errorf("device %s of %s LUN %d has size 0", name, v.IQN, v.LUN)
	}
	// The node in /dev must be the device sysfs describes: a stale node
	// left by an earlier device of the same name would pass a name check.
	devt, err := a.cfg.Sys.ReadAttr("block/" + name + "/dev")
	if err != nil {
		return volume.Device{}, err
	}
	path := filepath.Join(a.cfg.DevRoot, name)
	if err := a.checkNode(path, devt); err != nil {
		return volume.Device{}, err
	}
	num, err := volume.ParseDeviceNumber(devt)
	if err != nil {
		return volume.Device{}, fmt.Errorf("block/%s/dev: %w", name, err)
	}
	return volume.Device{Path: path, SizeBytes: size, Number: num}, nil
}

// CheckDevice re-reads sysfs for the device Attach returned (rec.Device,
// rec.DevNum) just before the driver formats, mounts or records it. A map
// is returned as it is. A single disk that nothing holds is returned as
// it is; one that a dm-multipath map of this LUN has taken since (a dm
// device whose dm/uuid starts "mpath-", whose slaves are all paths of
// the LUN with the disk's WWID, and whose size is the disk's) is
// replaced by that map. A disk held by anything else, or gone, or
// another device under its name, is an error wrapping
// volume.ErrUnavailable: mounting a disk a map holds fails (EBUSY) or,
// with raw block, writes around the map, so the stage fails and the CO
// retries it.
func (a *Attacher) CheckDevice(ctx context.Context, rec volume.Record) (volume.Device, error) {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return volume.Device{}, err
	}
	name := filepath.Base(rec.Device)
	if rec.Device != filepath.Join(a.cfg.DevRoot, name) {
		return volume.Device{}, fmt.Errorf("device %s of volume %s is not in %s", rec.Device, rec.VolumeID, a.cfg.DevRoot)
	}
	devText, err := a.cfg.Sys.ReadAttr("block/" + name + "/dev")
	if err != nil {
		return volume.Device{}, fmt.Errorf("device %s of %s LUN %d: %w: %w", rec.Device, v.IQN, v.LUN, volume.ErrUnavailable, err)
	}
	devt, err := volume.ParseDeviceNumber(devText)
	if err != nil {
		return volume.Device{}, fmt.Errorf("device %s of %s LUN %d: %w", rec.Device, v.IQN, v.LUN, err)
	}
	if !rec.DevNum.IsZero() && devt != rec.DevNum {
		return volume.Device{}, fmt.Errorf("device %s of %s LUN %d is now device %s, not %s: %w", rec.Device, v.IQN, v.LUN, devt, rec.DevNum, volume.ErrUnavailable)
	}
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return volume.Device{}, err
	}
	s, l, ok := snap.PathOf(name)
	if !ok {
		// Not a disk of a session: the multipath map Attach found (or
		// a disk gone with its session, whose dev read failed above).
		return volume.Device{Path: rec.Device, SizeBytes: mapSize(snap, name), Number: devt}, nil
	}
	if len(l.Holders) == 0 {
		return volume.Device{Path: rec.Device, SizeBytes: l.SizeBytes, Number: devt}, nil
	}
	if s.TargetName != v.IQN || l.Address.LUN != v.LUN {
		return volume.Device{}, fmt.Errorf("device %s is LUN %d of %s, not of the volume's %s LUN %d", rec.Device, l.Address.LUN, s.TargetName, v.IQN, v.LUN)
	}
	m, found, _, err := mapOver(snap, v, l.WWID, []lunPath{{session: s, lun: l}})
	if err != nil {
		return volume.Device{}, fmt.Errorf("disk %s of %s LUN %d was taken by a device since it was attached: %w: %w", name, v.IQN, v.LUN, volume.ErrUnavailable, err)
	}
	if !found || len(l.Holders) != 1 || l.Holders[0] != m.Device {
		return volume.Device{}, fmt.Errorf("disk %s of %s LUN %d is held by %s, which is not a multipath map of the LUN; not using a disk another device holds: %w",
			name, v.IQN, v.LUN, strings.Join(l.Holders, ", "), volume.ErrUnavailable)
	}
	if m.SizeBytes != l.SizeBytes {
		return volume.Device{}, fmt.Errorf("multipath map %s (%s) of %s LUN %d has %d bytes, its path %s has %d: %w", m.Device, m.Name, v.IQN, v.LUN, m.SizeBytes, name, l.SizeBytes, volume.ErrUnavailable)
	}
	mdevText, err := a.cfg.Sys.ReadAttr("block/" + m.Device + "/dev")
	if err != nil {
		return volume.Device{}, err
	}
	path := filepath.Join(a.cfg.DevRoot, m.Device)
	if err := a.checkNode(path, mdevText); err != nil {
		return volume.Device{}, err
	}
	mdevt, err := volume.ParseDeviceNumber(mdevText)
	if err != nil {
		return volume.Device{}, fmt.Errorf("multipath map %s: %w", m.Device, err)
	}
	klog.FromContext(ctx).Info("A multipath map took the volume's disk after the attach; using the map", "volumeID", rec.VolumeID, "iqn", v.IQN, "lun", v.LUN, "disk", name, "map", m.Device, "mapName", m.Name)
	return volume.Device{Path: path, SizeBytes: m.SizeBytes, Number: mdevt}, nil
}

// mapSize is the size of the multipath map name, 0 when it is not one.
func mapSize(snap *iscsi.Snapshot, name string) int64 {
	for _, m := range snap.Maps {
		if m.Device == name {
			return m.SizeBytes
		}
	}
	return 0
}

// waitDisks polls sysfs until every logged-in session has the LUN's disk,
// scanning exactly that LUN on a session that lacks it for scanAfter. At
// the deadline it settles for the paths found, if any.
func (a *Attacher) waitDisks(ctx context.Context, v *volume.ISCSI, loggedIn []iscsi.Node) ([]lunPath, error) {
	clk := a.cfg.Clock
	start := clk.Now()
	scanned := map[iscsi.SessionID]bool{}
	for {
		snap, err := iscsi.Read(a.cfg.Sys, clk.Now())
		if err != nil {
			return nil, err
		}
		paths, lacking := lunPaths(ctx, a.cfg.Resolver, snap, v, loggedIn)
		if len(lacking) == 0 {
			return paths, nil
		}
		// The login scanned the target; a LUN added later (or a lost scan
		// event) needs a scan of its own, of that LUN only.
		if clk.Since(start) >= scanAfter {
			for _, s := range lacking {
				a.scan(ctx, s, v.LUN, scanned)
			}
		}
		if clk.Since(start) >= a.cfg.DeviceTimeout {
			if len(paths) > 0 {
				klog.FromContext(ctx).Info("LUN disk missing on some sessions; attaching with the paths found", "iqn", v.IQN, "lun", v.LUN, "paths", describe(paths), "missing", len(lacking))
				return paths, nil
			}
			return nil, fmt.Errorf("LUN %d of %s: no disk on %d logged-in session(s) after %s: %w", v.LUN, v.IQN, len(lacking), a.cfg.DeviceTimeout, context.DeadlineExceeded)
		}
		if err := sleep(ctx, clk, a.cfg.PollInterval); err != nil {
			return nil, fmt.Errorf("LUN %d of %s: %w", v.LUN, v.IQN, err)
		}
	}
}

// scan writes a scan of exactly this LUN once per session.
func (a *Attacher) scan(ctx context.Context, s iscsi.Session, lun int, scanned map[iscsi.SessionID]bool) {
	if scanned[s.ID] || s.TargetID < 0 || !s.State.LoggedIn() {
		return
	}
	scanned[s.ID] = true
	addr := iscsi.SCSIAddress{Host: s.Host, Channel: 0, Target: s.TargetID, LUN: lun}
	if err := a.cfg.Initiator.Rescan(addr); err != nil {
		klog.FromContext(ctx).V(2).Info("LUN scan failed", "session", s.ID.String(), "address", addr.String(), "err", err)
	}
}

// lunPaths returns the disks of the volume's LUN on the sessions of the
// logged-in nodes, and the sessions (a zero Session for a node with none)
// still lacking one.
func lunPaths(ctx context.Context, r iscsi.Resolver, snap *iscsi.Snapshot, v *volume.ISCSI, nodes []iscsi.Node) (paths []lunPath, lacking []iscsi.Session) {
	m := iscsi.NewPortalMatcher(ctx, r)
	for _, n := range nodes {
		found := false
		for _, s := range snap.SessionsOf(v.IQN) {
			if !m.Session(s, v.IQN, n.Portal) {
				continue
			}
			found = true
			if l, ok := s.LUN(v.LUN); ok && l.Disk != "" {
				paths = append(paths, lunPath{session: s, lun: l})
			} else {
				lacking = append(lacking, s)
			}
		}
		if !found {
			lacking = append(lacking, iscsi.Session{TargetID: -1})
		}
	}
	return paths, lacking
}

// verifyPaths checks that the paths are one LUN, and the one asked for:
// every path has the same size and the same WWID. When the kernel
// publishes a WWID on no path, wwid is "" and only the sizes are compared;
// a WWID on some paths but not on others is an error, since the paths
// without one cannot be shown to be the same LUN.
func verifyPaths(v *volume.ISCSI, paths []lunPath) (wwid string, size int64, err error) {
	if len(paths) == 0 {
		return "", 0, fmt.Errorf("no disk of %s LUN %d to verify", v.IQN, v.LUN)
	}
	first := paths[0]
	wwid, size = first.lun.WWID, first.lun.SizeBytes
	for _, p := range paths[1:] {
		switch {
		case p.lun.WWID == wwid:
		case wwid == "":
			return "", 0, fmt.Errorf("cannot verify %s: the kernel publishes no WWID for it, while %s has %s", first, p, p.lun.WWID)
		case p.lun.WWID == "":
			return "", 0, fmt.Errorf("cannot verify %s: the kernel publishes no WWID for it, while %s has %s", p, first, wwid)
		default:
			return "", 0, fmt.Errorf("paths of %s LUN %d disagree on identity: %s has %s, %s has %s", v.IQN, v.LUN, first, wwid, p, p.lun.WWID)
		}
		if p.lun.SizeBytes != size {
			return "", 0, fmt.Errorf("paths of %s LUN %d disagree on size: %s has %d bytes, %s has %d", v.IQN, v.LUN, first, size, p, p.lun.SizeBytes)
		}
	}
	return wwid, size, nil
}

// waitMap looks for the dm-multipath map over the paths. It waits up to
// MultipathWait for multipathd to assemble one that holds them all (for
// a single path too, unless NoMultipathd); a map holding a device that is
// not a path of this LUN is an error.
func (a *Attacher) waitMap(ctx context.Context, v *volume.ISCSI, wwid string, paths []lunPath) (iscsi.MultipathMap, bool, error) {
	clk := a.cfg.Clock
	start := clk.Now()
	for {
		snap, err := iscsi.Read(a.cfg.Sys, clk.Now())
		if err != nil {
			return iscsi.MultipathMap{}, false, err
		}
		m, found, complete, err := mapOver(snap, v, wwid, paths)
		if err != nil || complete || (!found && a.cfg.NoMultipathd) {
			return m, found, err
		}
		if clk.Since(start) >= a.cfg.MultipathWait {
			return m, found, nil // a partial map or none: use what is there
		}
		if err := sleep(ctx, clk, a.cfg.PollInterval); err != nil {
			return iscsi.MultipathMap{}, false, err
		}
	}
}

// mapOver finds the one map holding any of the paths' disks and checks
// that every device it holds is a path of the same LUN: one with the
// LUN's WWID or, when the LUN has none (wwid ""), one of the same target
// and LUN number without a WWID. complete is set when it holds every path.
func mapOver(snap *iscsi.Snapshot, v *volume.ISCSI, wwid string, paths []lunPath) (m iscsi.MultipathMap, found, complete bool, err error) {
	for _, p := range paths {
		pm, ok := snap.MapOf(p.lun.Disk)
		if !ok {
			continue
		}
		if found && pm.Device != m.Device {
			return iscsi.MultipathMap{}, false, false, fmt.Errorf("paths of one LUN are in two multipath maps, %s and %s", m.Device, pm.Device)
		}
		m, found = pm, true
	}
	if !found {
		return m, false, false, nil
	}
	// A map that also holds a foreign device is not this volume's map,
	// whatever its name says.
	for _, sl := range m.Slaves {
		s, l, ok := snap.PathOf(sl)
		same := ok && l.WWID == wwid
		if same && wwid == "" {
			same = s.TargetName == v.IQN && l.Address.LUN == v.LUN
		}
		if same {
			continue
		}
		lun := wwid
		if lun == "" {
			lun = fmt.Sprintf("%d of %s (no WWID)", v.LUN, v.IQN)
		}
		return iscsi.MultipathMap{}, false, false, fmt.Errorf("multipath map %s (%s) holds %s, which is not a path of LUN %s", m.Device, m.Name, sl, lun)
	}
	return m, true, len(m.Slaves) >= len(paths), nil
}

// sleep waits d on clk or until ctx ends.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) error {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func describe(paths []lunPath) string {
	s := make([]string, 0, len(paths))
	for _, p := range paths {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// checkBlockNode verifies that path is a block device node whose device
// number is devt ("8:0", the sysfs dev attribute).
func checkBlockNode(path, devt string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("device node: %w", err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("%s is not a block device", path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no device number", path)
	}
	major, minor := devMajorMinor(uint64(st.Rdev))
	if got := strconv.FormatUint(major, 10) + ":" + strconv.FormatUint(minor, 10); got != devt {
		return fmt.Errorf("%s is device %s, sysfs says %s", path, got, devt)
	}
	return nil
}

// devMajorMinor splits a Linux dev_t (glibc's gnu_dev_major/minor).
func devMajorMinor(dev uint64) (major, minor uint64) {
	major = (dev&0x00000000000fff00)>>8 | (dev&0xfffff00000000000)>>32
	minor = dev&0x00000000000000ff | (dev&0x00000ffffff00000)>>12
	return major, minor
}

// errNoDevice marks a volume whose LUN has no disk on this node.
var errNoDevice = errors.New("no disk of the LUN on this node")
