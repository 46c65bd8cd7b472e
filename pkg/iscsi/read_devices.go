package iscsi

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// sectorSize is the unit of a block device's size attribute.
const sectorSize = 512

// mpathUUIDPrefix marks a dm-multipath map's dm/uuid.
const mpathUUIDPrefix = "mpath-"

// luns walks the session device's target<H:C:T>/<H:C:T:L> directories and
// reads each SCSI device with its block device. A session without a
// target directory (no LUN reported yet) has no LUNs.
func (p *pass) luns(m *sessionMemo) ([]LUN, error) {
	sd, err := p.root.OpenDir(m.sessDev)
	if err != nil {
		return nil, err
	}
	entries, err := sd.Names(m.devices)
	sd.Close()
	if err != nil {
		return nil, err
	}
	m.devices = entries
	if m.targets == nil {
		m.targets = map[string]*targetMemo{}
	}
	var luns []LUN
	for _, t := range entries {
		if !strings.HasPrefix(t, "target") {
			continue
		}
		if _, _, _, err := parseTargetDir(t); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", m.sessDev, t, err)
		}
		tm := m.targets[t]
		if tm == nil {
			tm = &targetMemo{rel: m.sessDev + "/" + t, luns: map[string]*lunMemo{}}
			m.targets[t] = tm
		}
		tm.seen = p.r.pass
		if luns, err = p.targetLUNs(tm, luns); err != nil {
			if _, serr := p.root.Stat(tm.rel); removed(err) && sysfs.IsNotExist(serr) {
				continue // the target was removed during the read (a logout's scsi_remove_target)
			}
			return nil, err
		}
	}
	maps.DeleteFunc(m.targets, func(_ string, x *targetMemo) bool { return x.seen != p.r.pass })
	slices.SortFunc(luns, func(a, b LUN) int { return a.Address.LUN - b.Address.LUN })
	return luns, nil
}

// targetLUNs appends the LUNs of one target directory to luns. Beside the
// H:C:T:L device directories the target directory holds power/,
// subsystem and uevent; those fail to parse and are skipped.
func (p *pass) targetLUNs(tm *targetMemo, luns []LUN) ([]LUN, error) {
	td, err := p.root.OpenDir(tm.rel)
	if err != nil {
		return nil, err
	}
	defer td.Close()
	if tm.devs, err = td.Names(tm.devs); err != nil {
		return nil, err
	}
	for _, d := range tm.devs {
		addr, err := ParseSCSIAddress(d)
		if err != nil {
			continue // power, subsystem, uevent: not a device
		}
		lm := tm.luns[d]
		if lm == nil {
			lm = &lunMemo{state: d + "/state", wwid: d + "/wwid", vpd: tm.rel + "/" + d + "/vpd_pg83", block: tm.rel + "/" + d + "/block"}
			tm.luns[d] = lm
		}
		lm.seen = p.r.pass
		l, err := p.lun(td, lm, addr)
		if err != nil {
			if _, serr := td.Stat(d); sysfs.IsNotExist(serr) || deleting(td, d, err) {
				continue // deleted, or being deleted, during the read
			}
			return nil, err
		}
		luns = append(luns, l)
	}
	maps.DeleteFunc(tm.luns, func(_ string, x *lunMemo) bool { return x.seen != p.r.pass })
	return luns, nil
}

// lun reads one SCSI device below target directory td. Its state, WWID
// (sdev_show_wwid prints the VPD page 0x83 a rescan re-reads), disk, size
// and holders are read every time.
func (p *pass) lun(td sysfs.Dir, lm *lunMemo, addr SCSIAddress) (LUN, error) {
	l := LUN{Address: addr}
	if err := text(td, lm.state, &lm.stateText); err != nil {
		return LUN{}, err
	}
	l.State = DeviceState(lm.stateText)
	var err error
	if l.WWID, err = p.wwid(td, lm); err != nil {
		return LUN{}, err
	}
	bd, err := p.root.OpenDir(lm.block)
	if sysfs.IsNotExist(err) {
		return l, nil // the disk driver has not bound (yet)
	}
	if err != nil {
		return LUN{}, err
	}
	defer bd.Close()
	if lm.disks, err = bd.Names(lm.disks); err != nil {
		return LUN{}, err
	}
	// A SCSI disk has exactly one block device; more would be a layout
	// this model does not understand.
	if len(lm.disks) != 1 {
		return LUN{}, fmt.Errorf("%s: want one disk, found %d", lm.block, len(lm.disks))
	}
	l.Disk = lm.disks[0]
	dm := lm.disk
	if dm == nil || dm.name != l.Disk {
		dm = &diskMemo{name: l.Disk, size: l.Disk + "/size", holders: lm.block + "/" + l.Disk + "/holders"}
		lm.disk = dm
	}
	if err := text(bd, dm.size, &dm.sizeText); err != nil {
		if deleting(bd, l.Disk, err) {
			// The disk is being deleted (sd released the device): the
			// LUN is read without it, as one whose driver has not bound.
			// A LUN being deleted loses its own attributes first, and
			// its caller leaves it out.
			l.Disk = ""
			return l, nil
		}
		return LUN{}, err
	}
	sectors, err := strconv.ParseInt(dm.sizeText, 10, 64)
	if err != nil {
		return LUN{}, fmt.Errorf("parse %s/%s: %w", bd.Rel(), dm.size, err)
	}
	l.SizeBytes = sectors * sectorSize
	if dm.holderNames, err = p.listDir(p.root, dm.holders, dm.holderNames); err != nil {
		return LUN{}, err
	}
	l.Holders = dm.holderNames
	return l, nil
}

// wwid returns the device's wwid attribute or, on kernels without it,
// the identifier derived from the raw vpd_pg83 page; "" when neither
// exists or the page holds no identifier pathmend can derive (a
// malformed or designator-less page): one odd LUN must not make the whole
// node unreadable, and a LUN without a WWID is verified by size alone.
func (p *pass) wwid(td sysfs.Dir, lm *lunMemo) (string, error) {
	b, ok, err := td.ReadOptionalAttr(lm.wwid)
	if err != nil {
		return "", err
	}
	if ok {
		lm.wwidText = sysfs.Intern(b, lm.wwidText)
		return lm.wwidText, nil
	}
	if lm.wwidText != "" {
		// The kernel published wwid for this device and no longer does:
		// the attribute vanished. A missing entry (its caller tells a
		// device being deleted from a broken one), not "no WWID".
		return "", fmt.Errorf("read %s/%s: %w", td.Rel(), lm.wwid, fs.ErrNotExist)
	}
	page, ok, err := readBinary(p.sys, lm.vpd)
	if err != nil {
		return "", err
	}
	if !ok {
		// Neither attribute: a kernel that publishes neither, or a
		// device being deleted, which its caller leaves out (its uevent
		// went first).
		dev := strings.TrimSuffix(lm.wwid, "/wwid")
		if _, serr := td.Stat(dev + "/uevent"); sysfs.IsNotExist(serr) {
			return "", fmt.Errorf("read %s/%s: %w", td.Rel(), lm.wwid, fs.ErrNotExist)
		}
		return "", nil
	}
	id, err := ParseVPD83(page)
	if err != nil {
		return "", nil
	}
	return id, nil
}

// readBinary reads a binary attribute whole, bounded. sysfs.FS.ReadAttr
// trims trailing NULs, spaces and newlines, which are valid bytes of a
// VPD page, so the page is read raw below the same root.
func readBinary(sys sysfs.FS, rel string) ([]byte, bool, error) {
	f, err := os.Open(sys.Path(rel))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", rel, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxVPDPage+1))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", rel, err)
	}
	if len(b) > maxVPDPage {
		return nil, false, fmt.Errorf("read %s: longer than %d bytes", rel, maxVPDPage)
	}
	return b, true, nil
}

// multipathMaps lists block/dm-* and keeps the dm-multipath maps.
func (p *pass) multipathMaps() ([]MultipathMap, error) {
	names, err := p.list("block")
	if err != nil {
		return nil, err
	}
	var found []MultipathMap
	for _, name := range names {
		if !strings.HasPrefix(name, "dm-") {
			continue
		}
		m, ok, err := p.multipathMap(name)
		if err != nil {
			if _, serr := p.sys.ReadLink("block/" + name); sysfs.IsNotExist(serr) {
				continue // removed during the read
			}
			return nil, err
		}
		if ok {
			found = append(found, m)
		}
	}
	slices.SortFunc(found, func(a, b MultipathMap) int {
		if devLess(a.Device, b.Device) {
			return -1
		}
		return 1
	})
	return found, nil
}

// multipathMap reads block/<name>. Every dm device has dm/uuid (empty for
// some); only the "mpath-" prefix marks a multipath map. The UUID is read
// until it is set, which the kernel allows once; the name (a rename),
// slaves, holders and size are read every time.
func (p *pass) multipathMap(name string) (MultipathMap, bool, error) {
	mm := p.r.maps[name]
	if mm == nil {
		mm = &mapMemo{object: object{rel: "block/" + name}}
		p.r.maps[name] = mm
	}
	d, same, err := p.open(&mm.object)
	if err != nil {
		return MultipathMap{}, false, err
	}
	defer d.Close()
	if !same {
		*mm = mapMemo{object: mm.object}
	}
	if mm.uuid == "" {
		if err := text(d, "dm/uuid", &mm.uuid); err != nil {
			// The kernel removes a map's dm/ directory before its block
			// device (cleanup_mapped_device: dm_sysfs_exit, then
			// del_gendisk), and registers it only at the first table
			// load: a dm device without dm/ is being removed or has no
			// table, so it holds no disk. It is read again next time.
			if _, serr := d.Stat("dm"); sysfs.IsNotExist(err) && sysfs.IsNotExist(serr) {
				return MultipathMap{}, false, nil
			}
			return MultipathMap{}, false, err
		}
	}
	if !strings.HasPrefix(mm.uuid, mpathUUIDPrefix) {
		return MultipathMap{}, false, nil // LVM, crypt, …: not ours to read
	}
	m := MultipathMap{Device: name, UUID: mm.uuid}
	if err := text(d, "dm/name", &mm.name); err != nil {
		return MultipathMap{}, false, err
	}
	m.Name = mm.name
	if mm.slaves, err = p.listDir(d, "slaves", mm.slaves); err != nil {
		return MultipathMap{}, false, err
	}
	if mm.holders, err = p.listDir(d, "holders", mm.holders); err != nil {
		return MultipathMap{}, false, err
	}
	m.Slaves, m.Holders = mm.slaves, mm.holders
	if err := text(d, "size", &mm.size); err != nil {
		return MultipathMap{}, false, err
	}
	sectors, err := strconv.ParseInt(mm.size, 10, 64)
	if err != nil {
		return MultipathMap{}, false, fmt.Errorf("parse %s/size: %w", d.Rel(), err)
	}
	m.SizeBytes = sectors * sectorSize
	return m, true, nil
}

// devLess orders dm-2 before dm-10.
func devLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// deleting reports whether err, from a read below the device directory
// dev of d (a SCSI device H:C:T:L, a disk), is the kernel deleting that
// device: the entry is missing and so is the device's uevent attribute
// (or the directory itself). device_del removes a device's uevent
// attribute first, then its attribute groups (a SCSI device's state, a
// disk's size), sends the remove event and drops the directory last;
// device_add creates the directory, then uevent, then the attributes, and
// announces the device only after them. A device directory without
// uevent is thus one being deleted (or not yet announced): no device to
// judge, and no broken tree. A missing attribute of a device that still
// has its uevent is an error.
func deleting(d sysfs.Dir, dev string, err error) bool {
	if !removed(err) {
		return false
	}
	_, serr := d.Stat(dev + "/uevent")
	return sysfs.IsNotExist(serr)
}

// removed reports whether err is a read of a sysfs entry that is not (or
// no longer) there: ENOENT, or the ENODEV kernfs answers a read of an
// attribute removed after it was opened.
func removed(err error) bool {
	return sysfs.IsNotExist(err) || errors.Is(err, syscall.ENODEV)
}
