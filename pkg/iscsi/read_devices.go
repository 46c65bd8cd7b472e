package iscsi

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// sectorSize is the unit of a block device's size attribute.
const sectorSize = 512

// mpathUUIDPrefix marks a dm-multipath map's dm/uuid.
const mpathUUIDPrefix = "mpath-"

// readLUNs walks sessDev/target<H:C:T>/<H:C:T:L> and reads each SCSI
// device with its block device. A session without a target directory
// (no LUN reported yet) has no LUNs.
func readLUNs(sys sysfs.FS, sessDev string) ([]LUN, error) {
	entries, err := sys.ReadDir(sessDev)
	if err != nil {
		return nil, err
	}
	var luns []LUN
	for _, t := range entries {
		if !strings.HasPrefix(t, "target") {
			continue
		}
		if _, _, _, err := parseTargetDir(t); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", sessDev, t, err)
		}
		tdir := sessDev + "/" + t
		// Beside the H:C:T:L device directories the target directory holds
		// power/, subsystem and uevent; those fail to parse and are skipped.
		devs, err := sys.ReadDir(tdir)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			addr, err := ParseSCSIAddress(d)
			if err != nil {
				continue // power, subsystem, uevent: not a device
			}
			l, err := readLUN(sys, tdir+"/"+d, addr)
			if err != nil {
				if _, serr := sys.Stat(tdir + "/" + d); sysfs.IsNotExist(serr) {
					continue // deleted during the read
				}
				return nil, err
			}
			luns = append(luns, l)
		}
	}
	sort.Slice(luns, func(i, j int) bool { return luns[i].Address.LUN < luns[j].Address.LUN })
	return luns, nil
}

func readLUN(sys sysfs.FS, dir string, addr SCSIAddress) (LUN, error) {
	l := LUN{Address: addr}
	state, err := sys.ReadAttr(dir + "/state")
	if err != nil {
		return LUN{}, err
	}
	l.State = DeviceState(state)
	if l.WWID, err = readWWID(sys, dir); err != nil {
		return LUN{}, err
	}
	disks, err := sys.ReadDir(dir + "/block")
	if sysfs.IsNotExist(err) {
		return l, nil // the disk driver has not bound (yet)
	}
	if err != nil {
		return LUN{}, err
	}
	// A SCSI disk has exactly one block device; more would be a layout
	// this model does not understand.
	if len(disks) != 1 {
		return LUN{}, fmt.Errorf("%s/block: want one disk, found %d", dir, len(disks))
	}
	l.Disk = disks[0]
	bdev := dir + "/block/" + l.Disk
	sectors, err := sys.ReadIntAttr(bdev + "/size")
	if err != nil {
		return LUN{}, err
	}
	l.SizeBytes = sectors * sectorSize
	if l.Holders, err = optionalDir(sys, bdev+"/holders"); err != nil {
		return LUN{}, err
	}
	return l, nil
}

// readWWID returns the device's wwid attribute or, on kernels without it,
// the identifier derived from the raw vpd_pg83 page; "" when neither
// exists or the page holds no identifier pathmend can derive (a
// malformed or designator-less page): one odd LUN must not make the whole
// node unreadable, and a LUN without a WWID is verified by size alone.
func readWWID(sys sysfs.FS, dir string) (string, error) {
	v, ok, err := sys.ReadOptionalAttr(dir + "/wwid")
	if err != nil || ok {
		return v, err
	}
	page, ok, err := readBinary(sys, dir+"/vpd_pg83")
	if err != nil || !ok {
		return "", err
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

// readMaps lists block/dm-* and keeps the dm-multipath maps.
func readMaps(sys sysfs.FS) ([]MultipathMap, error) {
	names, err := optionalDir(sys, "block")
	if err != nil {
		return nil, err
	}
	var maps []MultipathMap
	for _, name := range names {
		if !strings.HasPrefix(name, "dm-") {
			continue
		}
		m, ok, err := readMap(sys, name)
		if err != nil {
			if _, serr := sys.ReadLink("block/" + name); sysfs.IsNotExist(serr) {
				continue // removed during the read
			}
			return nil, err
		}
		if ok {
			maps = append(maps, m)
		}
	}
	sort.Slice(maps, func(i, j int) bool { return devLess(maps[i].Device, maps[j].Device) })
	return maps, nil
}

func readMap(sys sysfs.FS, name string) (MultipathMap, bool, error) {
	dir := "block/" + name
	// Every dm device has dm/uuid (empty for some); only the "mpath-"
	// prefix marks a multipath map.
	uuid, err := sys.ReadAttr(dir + "/dm/uuid")
	if err != nil {
		return MultipathMap{}, false, err
	}
	if !strings.HasPrefix(uuid, mpathUUIDPrefix) {
		return MultipathMap{}, false, nil // LVM, crypt, …: not ours to read
	}
	m := MultipathMap{Device: name, UUID: uuid}
	if m.Name, err = sys.ReadAttr(dir + "/dm/name"); err != nil {
		return MultipathMap{}, false, err
	}
	if m.Slaves, err = optionalDir(sys, dir+"/slaves"); err != nil {
		return MultipathMap{}, false, err
	}
	if m.Holders, err = optionalDir(sys, dir+"/holders"); err != nil {
		return MultipathMap{}, false, err
	}
	sectors, err := sys.ReadIntAttr(dir + "/size")
	if err != nil {
		return MultipathMap{}, false, err
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
