// Package mountstest is a node's mount table in memory, for tests and
// the node simulation: mounts stack at a path as the kernel stacks them
// (a mount on a mount point goes on top, a foreign one may be slid
// under), carry IDs, parents, roots, device numbers and sources as
// mountinfo lists them, and a restart of the plugin in a new mount
// namespace numbers them anew. It implements mount.Interface (as
// k8s.io/mount-utils' FakeMounter does, without touching the disk) and
// the driver's mount-table seams (MountInfo, Unmount, Namespace).
//
// Layers added with Foreign are someone else's: the table remembers them,
// and OnUnmount is told whether a layer unmounted was one.
package mountstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Table is the mount table of one node. The zero value is not usable;
// create one with New.
type Table struct {
	mu      sync.Mutex
	layers  []mounts.Layer // table order: the order of mountinfo
	foreign map[int]bool
	next    int
	devs    map[string]volume.DeviceNumber
	ns      mounts.Namespace
	nsGen   int
	log     []string

	// DevOf, when set, gives the device number of a mount's source (a
	// device path), and a mount of a source it does not know fails as
	// the kernel fails a mount of a device that is gone; when nil, a
	// block device node's number, or a number the table makes up per
	// source.
	DevOf func(source string) (volume.DeviceNumber, bool)
	// OnUnmount, when set, is called with every layer unmounted and
	// whether it was foreign, under no lock.
	OnUnmount func(l mounts.Layer, foreign bool)
	// MountErr, when set, is returned by the next Mount instead of
	// mounting (and cleared).
	MountErr error
}

var _ mount.Interface = (*Table)(nil)

// New returns a table holding only the root filesystem.
func New() *Table {
	t := &Table{foreign: map[int]bool{}, next: 20, devs: map[string]volume.DeviceNumber{}}
	t.layers = []mounts.Layer{{ID: 1, Parent: 0, Dev: volume.DeviceNumber{Major: 8, Minor: 1}, Root: "/", MountPoint: "/", FSType: "ext4", Source: "/dev/sda1"}}
	t.ns = mounts.Namespace{Boot: "boot-1", Mount: mounts.ProcessNamespace("mnt:[4026532281]", 100, 1000)}
	return t
}

// Namespace is the seam of mounts.CurrentNamespace.
func (t *Table) Namespace() (mounts.Namespace, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ns, nil
}

// NewNamespace is a restarted or upgraded plugin container: a new mount
// namespace with a copy of every mount, each under a new ID, seen by a
// new process. As the kernel does when the old namespace is gone, the
// new one has the same inode number (/proc/self/ns/mnt reads the same).
func (t *Table) NewNamespace() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nsGen++
	t.ns.Mount = mounts.ProcessNamespace("mnt:[4026532281]", 100+t.nsGen, uint64(1000+100*t.nsGen))
	ids := map[int]int{}
	for i := range t.layers {
		ids[t.layers[i].ID] = t.next
		t.next++
	}
	foreign := map[int]bool{}
	for i := range t.layers {
		old := t.layers[i].ID
		t.layers[i].ID = ids[old]
		if p, ok := ids[t.layers[i].Parent]; ok {
			t.layers[i].Parent = p
		}
		if t.foreign[old] {
			foreign[ids[old]] = true
		}
	}
	t.foreign = foreign
}

// Reboot drops every mount but the root and starts a new boot.
func (t *Table) Reboot() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.layers = t.layers[:1]
	t.foreign = map[int]bool{}
	t.ns.Boot += "'"
}

// MountInfo is the seam of mounts.ReadInfo: the table as mountinfo.
func (t *Table) MountInfo() ([]mount.MountInfo, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]mount.MountInfo, 0, len(t.layers))
	for _, l := range t.layers {
		out = append(out, mount.MountInfo{ID: l.ID, ParentID: l.Parent, Major: int(l.Dev.Major), Minor: int(l.Dev.Minor),
			Root: l.Root, MountPoint: l.MountPoint, FsType: l.FSType, Source: l.Source})
	}
	return out, nil
}

// Snapshot is the table as mounts reads it.
func (t *Table) Snapshot() *mounts.Table {
	infos, _ := t.MountInfo()
	return mounts.NewTable(infos)
}

// Log is every mount and unmount, in order: "mount <target>",
// "unmount <target> <id>".
func (t *Table) Log() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.log)
}

// IsForeign reports whether the layer with id was added by Foreign.
func (t *Table) IsForeign(id int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.foreign[id]
}

// ForeignLayers returns the foreign layers still mounted.
func (t *Table) ForeignLayers() []mounts.Layer {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []mounts.Layer
	for _, l := range t.layers {
		if t.foreign[l.ID] {
			out = append(out, l)
		}
	}
	return out
}

// Foreign mounts a filesystem of someone else's at path: on top of the
// stack there, or, with beneath, slid under the top of it, as
// move_mount(2) MOVE_MOUNT_BENEATH does (on top when nothing is mounted
// at path).
func (t *Table) Foreign(path, fstype, source string, beneath bool) mounts.Layer {
	t.mu.Lock()
	defer t.mu.Unlock()
	path = filepath.Clean(path)
	l := mounts.Layer{ID: t.next, Root: "/", MountPoint: path, FSType: fstype, Source: source,
		Dev: volume.DeviceNumber{Major: 0, Minor: uint32(100 + t.next)}}
	t.next++
	t.foreign[l.ID] = true
	snap := t.snapshot()
	stack := snap.Stack(path)
	if beneath && len(stack) > 0 {
		top := stack[len(stack)-1]
		l.Parent = top.Parent
		for i := range t.layers {
			if t.layers[i].ID == top.ID {
				t.layers[i].Parent = l.ID
			}
		}
	} else {
		l.Parent = t.parentFor(snap, path)
	}
	t.layers = append(t.layers, l)
	return l
}

// RemoveForeign is an operator unmounting a foreign layer: umount, or
// umount -l when mounts are stacked on it or inside it, which takes
// them along (the kernel detaches the whole subtree).
func (t *Table) RemoveForeign(id int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := map[int]bool{id: true}
	for changed := true; changed; {
		changed = false
		for _, l := range t.layers {
			if !gone[l.ID] && gone[l.Parent] {
				gone[l.ID], changed = true, true
			}
		}
	}
	t.layers = slices.DeleteFunc(t.layers, func(l mounts.Layer) bool { return gone[l.ID] })
	for g := range gone {
		delete(t.foreign, g)
	}
	t.log = append(t.log, fmt.Sprintf("operator unmounts %d (%d mounts)", id, len(gone)))
}

func (t *Table) snapshot() *mounts.Table {
	out := make([]mount.MountInfo, 0, len(t.layers))
	for _, l := range t.layers {
		out = append(out, mount.MountInfo{ID: l.ID, ParentID: l.Parent, Major: int(l.Dev.Major), Minor: int(l.Dev.Minor),
			Root: l.Root, MountPoint: l.MountPoint, FsType: l.FSType, Source: l.Source})
	}
	return mounts.NewTable(out)
}

// parentFor is the mount a new mount at path goes on: the top of the
// stack at path, or the mount path lies in.
func (t *Table) parentFor(snap *mounts.Table, path string) int {
	if s := snap.Stack(path); len(s) > 0 {
		return s[len(s)-1].ID
	}
	l, _ := snap.Resolve(path)
	return l.ID
}

func (t *Table) devOf(source string) volume.DeviceNumber {
	if t.DevOf != nil {
		if n, ok := t.DevOf(source); ok {
			return n
		}
	}
	if n, ok := volume.NodeNumber(source); ok {
		return n
	}
	if n, ok := t.devs[source]; ok {
		return n
	}
	n := volume.DeviceNumber{Major: 253, Minor: uint32(len(t.devs) + 1)}
	t.devs[source] = n
	return n
}

// Mount mounts source at target: a bind when options hold "bind" (the
// layer shows the filesystem source lies in, with its root), else a
// filesystem on the device source.
func (t *Table) Mount(source, target, fstype string, options []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.MountErr; err != nil {
		t.MountErr = nil
		return err
	}
	target = filepath.Clean(target)
	if _, err := os.Stat(target); err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	snap := t.snapshot()
	l := mounts.Layer{ID: t.next, MountPoint: target}
	t.next++
	if slices.Contains(options, "bind") {
		src, ok := snap.Resolve(source)
		if !ok {
			return fmt.Errorf("bind %s: no mount", source)
		}
		rel := strings.TrimPrefix(filepath.Clean(source), src.MountPoint)
		if src.MountPoint == "/" {
			rel = filepath.Clean(source)
		}
		l.Dev, l.FSType, l.Source = src.Dev, src.FSType, src.Source
		l.Root = filepath.Clean(filepath.Join(src.Root, rel))
	} else {
		if t.DevOf != nil {
			if _, ok := t.DevOf(source); !ok {
				return fmt.Errorf("mount %s at %s: special device does not exist", source, target)
			}
		}
		l.Dev, l.FSType, l.Source, l.Root = t.devOf(source), fstype, source, "/"
	}
	l.Parent = t.parentFor(snap, target)
	t.layers = append(t.layers, l)
	t.log = append(t.log, "mount "+target)
	return nil
}

// MountSensitive is Mount.
func (t *Table) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	return t.Mount(source, target, fstype, append(slices.Clone(options), sensitive...))
}

// MountSensitiveWithoutSystemd is Mount.
func (t *Table) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	return t.MountSensitive(source, target, fstype, options, sensitive)
}

// MountSensitiveWithoutSystemdWithMountFlags is Mount.
func (t *Table) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, sensitive, _ []string) error {
	return t.MountSensitive(source, target, fstype, options, sensitive)
}

// ErrBusy is the kernel's EBUSY: something is mounted on the layer.
var ErrBusy = errors.New("device or resource busy")

// UnmountLayer is the seam of mounts.Unmount: it unmounts l when it is
// the top of the stack at its mount point and nothing is mounted on it.
func (t *Table) UnmountLayer(l mounts.Layer) error {
	t.mu.Lock()
	snap := t.snapshot()
	stack := snap.Stack(l.MountPoint)
	if len(stack) == 0 || stack[len(stack)-1].ID != l.ID {
		t.mu.Unlock()
		return fmt.Errorf("unmount %s: %w", l.MountPoint, mounts.ErrNotTop)
	}
	err := t.popLocked(snap, stack[len(stack)-1])
	foreign := t.foreign[l.ID]
	delete(t.foreign, l.ID)
	t.mu.Unlock()
	if err == nil && t.OnUnmount != nil {
		t.OnUnmount(l, foreign)
	}
	return err
}

func (t *Table) popLocked(snap *mounts.Table, top mounts.Layer) error {
	if len(snap.Children(top.ID)) > 0 {
		return fmt.Errorf("unmount %s: %w", top.MountPoint, ErrBusy)
	}
	t.layers = slices.DeleteFunc(t.layers, func(x mounts.Layer) bool { return x.ID == top.ID })
	t.log = append(t.log, fmt.Sprintf("unmount %s %d", top.MountPoint, top.ID))
	return nil
}

// Unmount unmounts the top of the stack at target, whoever's it is, as
// umount(8) does.
func (t *Table) Unmount(target string) error {
	t.mu.Lock()
	snap := t.snapshot()
	stack := snap.Stack(target)
	if len(stack) == 0 {
		t.mu.Unlock()
		return fmt.Errorf("unmount %s: not mounted", target)
	}
	top := stack[len(stack)-1]
	err := t.popLocked(snap, top)
	foreign := t.foreign[top.ID]
	delete(t.foreign, top.ID)
	t.mu.Unlock()
	if err == nil && t.OnUnmount != nil {
		t.OnUnmount(top, foreign)
	}
	return err
}

// List lists every mount, the root's too.
func (t *Table) List() ([]mount.MountPoint, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]mount.MountPoint, 0, len(t.layers))
	for _, l := range t.layers {
		out = append(out, mount.MountPoint{Device: l.Source, Path: l.MountPoint, Type: l.FSType})
	}
	return out, nil
}

// IsLikelyNotMountPoint reports whether nothing visible is mounted at
// file; a file that does not exist is an error, as mount-utils returns.
func (t *Table) IsLikelyNotMountPoint(file string) (bool, error) {
	if _, err := os.Stat(file); err != nil {
		return true, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.snapshot().Stack(file)) == 0, nil
}

// IsMountPoint is !IsLikelyNotMountPoint.
func (t *Table) IsMountPoint(file string) (bool, error) {
	notMnt, err := t.IsLikelyNotMountPoint(file)
	return !notMnt, err
}

// CanSafelySkipMountPointCheck is false.
func (t *Table) CanSafelySkipMountPointCheck() bool { return false }

// GetMountRefs lists the other mount points of the filesystem at
// pathname.
func (t *Table) GetMountRefs(pathname string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap := t.snapshot()
	l, ok := snap.Resolve(pathname)
	if !ok {
		return nil, nil
	}
	var refs []string
	for _, x := range t.layers {
		if x.Dev == l.Dev && x.MountPoint != filepath.Clean(pathname) {
			refs = append(refs, x.MountPoint)
		}
	}
	return refs, nil
}

// SysfsDevices is a DevOf for fake kernels whose device nodes are plain
// files: the number sysfs block/<name>/dev gives the device a source
// names, from the first tree that has it.
func SysfsDevices(trees ...sysfs.FS) func(source string) (volume.DeviceNumber, bool) {
	return func(source string) (volume.DeviceNumber, bool) {
		name := filepath.Base(source)
		for _, fs := range trees {
			if v, err := fs.ReadAttr("block/" + name + "/dev"); err == nil {
				if n, err := volume.ParseDeviceNumber(v); err == nil {
					return n, true
				}
			}
		}
		return volume.DeviceNumber{}, false
	}
}
