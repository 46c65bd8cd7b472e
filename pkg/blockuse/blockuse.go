package blockuse

import (
	"fmt"
	"slices"
	"strings"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// MaxPartitions bounds the partitions of one device that are read; a
// device with more counts as in use (cannot tell).
const MaxPartitions = 128

// maxReasons bounds the uses listed in one answer.
const maxReasons = 4

// MountTable reads the host's mount table with each mount's device
// number, root and filesystem type.
type MountTable func() ([]mount.MountInfo, error)

// MountInfoFile is a MountTable reading a mountinfo file, e.g.
// /proc/1/mountinfo.
func MountInfoFile(path string) MountTable {
	return func() ([]mount.MountInfo, error) { return mount.ParseMountInfo(path) }
}

// Reader answers whether a block device is in use on the node.
type Reader struct {
	sys    sysfs.FS
	mounts MountTable
}

// New returns a Reader over sys (the node's sysfs) and mounts (the host's
// mount table).
func New(sys sysfs.FS, mounts MountTable) *Reader {
	return &Reader{sys: sys, mounts: mounts}
}

// part is the device or one of its partitions.
type part struct {
	name   string
	rel    string // block/<dev>[/<part>]
	number volume.DeviceNumber
	// sources are the mount sources naming it: /dev/<name>, and for a
	// device-mapper device /dev/mapper/<dm/name>.
	sources []string
}

// InUse reports whether block device dev (a name under block/, e.g.
// "sdb" or "dm-3") is in use on the node, and why: its holders, its
// mounts, the binds of its device node, or why that cannot be told. It
// fails closed: anything it cannot read makes the answer in use.
func (r *Reader) InUse(dev string) (inUse bool, why string) {
	if dev == "" || strings.ContainsAny(dev, "/\x00") || dev == "." || dev == ".." {
		return true, fmt.Sprintf("cannot tell whether %q is in use: not a block device name", dev)
	}
	parts, err := r.parts(dev)
	if err != nil {
		return true, fmt.Sprintf("cannot tell whether %s is in use: %v", dev, err)
	}
	var uses []string
	for _, p := range parts {
		hs, err := r.sys.ReadDir(p.rel + "/holders")
		if err != nil {
			return true, fmt.Sprintf("cannot tell whether %s is in use: %v", dev, err)
		}
		if len(hs) > 0 {
			uses = append(uses, fmt.Sprintf("%s is held by %s", p.name, strings.Join(hs, ",")))
		}
	}
	if r.mounts == nil {
		return true, fmt.Sprintf("cannot tell whether %s is in use: no mount table", dev)
	}
	infos, err := r.mounts()
	if err != nil {
		return true, fmt.Sprintf("cannot tell whether %s is in use: mount table: %v", dev, err)
	}
	for _, mi := range infos {
		for _, p := range parts {
			n := volume.DeviceNumber{Major: uint32(mi.Major), Minor: uint32(mi.Minor)}
			switch {
			case n == p.number, slices.Contains(p.sources, mi.Source):
				// The number is the filesystem's st_dev: the device's own
				// for ext4 or xfs; btrfs reports an anonymous one, and
				// its source names the device.
				uses = append(uses, fmt.Sprintf("%s is mounted at %s", p.name, mi.MountPoint))
			case mi.FsType == "devtmpfs" && mi.Root == "/"+p.name:
				uses = append(uses, fmt.Sprintf("the device node of %s is bound at %s", p.name, mi.MountPoint))
			}
		}
	}
	if len(uses) == 0 {
		return false, dev + " is not held, mounted or bound anywhere on the node"
	}
	if len(uses) > maxReasons {
		uses = append(uses[:maxReasons], fmt.Sprintf("%d more", len(uses)-maxReasons))
	}
	return true, strings.Join(uses, "; ")
}

// parts returns dev and its partitions with their device numbers. A
// partition is a subdirectory of block/<dev> holding a partition
// attribute (block/sdb/sdb1/partition).
func (r *Reader) parts(dev string) ([]part, error) {
	rel := "block/" + dev
	n, err := r.number(rel)
	if err != nil {
		return nil, err
	}
	sources := []string{"/dev/" + dev}
	if dm, ok, err := r.sys.ReadOptionalAttr(rel + "/dm/name"); err != nil {
		return nil, err
	} else if ok && dm != "" {
		sources = append(sources, "/dev/mapper/"+dm)
	}
	out := []part{{name: dev, rel: rel, number: n, sources: sources}}
	names, err := r.sys.ReadDir(rel)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, dev) || name == dev {
			continue // attributes and directories of the disk itself
		}
		prel := rel + "/" + name
		if _, ok, err := r.sys.ReadOptionalAttr(prel + "/partition"); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		if len(out) > MaxPartitions {
			return nil, fmt.Errorf("%s has more than %d partitions", rel, MaxPartitions)
		}
		pn, err := r.number(prel)
		if err != nil {
			return nil, err
		}
		out = append(out, part{name: name, rel: prel, number: pn, sources: []string{"/dev/" + name}})
	}
	return out, nil
}

// number reads rel/dev, "major:minor".
func (r *Reader) number(rel string) (volume.DeviceNumber, error) {
	s, err := r.sys.ReadAttr(rel + "/dev")
	if err != nil {
		return volume.DeviceNumber{}, err
	}
	n, err := volume.ParseDeviceNumber(s)
	if err != nil {
		return volume.DeviceNumber{}, fmt.Errorf("parse %s/dev: %w", rel, err)
	}
	return n, nil
}
