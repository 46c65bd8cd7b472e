package mounts

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Layer is one mount of the table: one line of mountinfo.
type Layer struct {
	// ID and Parent are the mount's ID and its parent's (fields 1, 2).
	ID, Parent int
	// Dev is the device number of the mounted filesystem (field 3).
	Dev volume.DeviceNumber
	// Root is the directory of the filesystem that forms the mount's
	// root (field 4); MountPoint is where it is mounted (field 5).
	Root, MountPoint string
	// FSType and Source are fields 9 and 10.
	FSType, Source string
}

// String names the layer for messages and errors: its filesystem type,
// its source and its ID.
func (l Layer) String() string {
	return fmt.Sprintf("%s %s (mount %d)", l.FSType, strconv.Quote(l.Source), l.ID)
}

// Record is the layer as a staged-volume record keeps it, read in ns.
func (l Layer) Record(ns Namespace) volume.MountLayer {
	return volume.MountLayer{ID: l.ID, Parent: l.Parent, Dev: l.Dev, Root: l.Root, FSType: l.FSType,
		Source: l.Source, Boot: ns.Boot, Namespace: ns.Mount}
}

// Is reports whether l is the mount r recorded: read in the same mount
// namespace of the same boot, with the same ID, parent, device number,
// root, filesystem type and source. A mount ID alone proves nothing (the
// kernel reuses them); together with the rest, a different mount would
// have to look the same in every field.
func (l Layer) Is(r volume.MountLayer, ns Namespace) bool {
	return r.Boot == ns.Boot && r.Namespace == ns.Mount && ns.Boot != "" && ns.Mount != "" &&
		l.ID == r.ID && l.Parent == r.Parent && l.Dev == r.Dev && SameRoot(l.Root, r.Root) &&
		l.FSType == r.FSType && l.Source == r.Source
}

// SameRoot reports whether a layer's root (mountinfo field 4) is root:
// the same path, or that path with "//deleted" after it — the kernel's
// word for a bind whose source was unlinked since (a device node the
// kernel removed under a block volume's publication). The mount is the
// same one.
func SameRoot(layerRoot, root string) bool {
	return layerRoot == root || layerRoot == root+"//deleted"
}

// Table is a snapshot of the mount table.
type Table struct {
	infos    []mount.MountInfo
	layers   []Layer
	byID     map[int]int      // ID → index in layers
	children map[int][]int    // parent ID → indexes, in table order
	at       map[string][]int // mount point → indexes, in table order
	root     int              // index of the root mount; -1 when there is none
}

// NewTable builds a table from mountinfo lines as mount-utils and
// ReadInfo parse them.
func NewTable(infos []mount.MountInfo) *Table {
	t := &Table{infos: infos, layers: make([]Layer, 0, len(infos)), byID: make(map[int]int, len(infos)), children: map[int][]int{},
		at: make(map[string][]int, len(infos)), root: -1}
	for _, mi := range infos {
		l := Layer{ID: mi.ID, Parent: mi.ParentID, Dev: volume.DeviceNumber{Major: uint32(mi.Major), Minor: uint32(mi.Minor)},
			Root: mi.Root, MountPoint: filepath.Clean(mi.MountPoint), FSType: mi.FsType, Source: mi.Source}
		t.byID[l.ID] = len(t.layers)
		t.at[l.MountPoint] = append(t.at[l.MountPoint], len(t.layers))
		t.layers = append(t.layers, l)
	}
	for i, l := range t.layers {
		if _, ok := t.byID[l.Parent]; ok && l.Parent != l.ID {
			t.children[l.Parent] = append(t.children[l.Parent], i)
			continue
		}
		// The root of the namespace's tree: its parent is itself, or a
		// mount outside this namespace (a container's root).
		if l.MountPoint == "/" && t.root < 0 {
			t.root = i
		}
	}
	return t
}

// Infos returns the mountinfo lines the table was built from, in table
// order. A Table is never changed once built: the slice must not be
// changed either.
func (t *Table) Infos() []mount.MountInfo { return t.infos }

// Layers returns every layer in table order.
func (t *Table) Layers() []Layer { return append([]Layer(nil), t.layers...) }

// Layer returns the layer with id.
func (t *Table) Layer(id int) (Layer, bool) {
	i, ok := t.byID[id]
	if !ok {
		return Layer{}, false
	}
	return t.layers[i], true
}

// Children returns the mounts whose parent is id.
func (t *Table) Children(id int) []Layer {
	var out []Layer
	for _, i := range t.children[id] {
		out = append(out, t.layers[i])
	}
	return out
}

// onTop returns the index of the mount at p on the mount cur: the last
// child of cur mounted at p (the kernel lists a later mount after an
// earlier one); -1 when none is.
func (t *Table) onTop(cur int, p string) int {
	next := -1
	for _, i := range t.children[t.layers[cur].ID] {
		if t.layers[i].MountPoint == p {
			next = i
		}
	}
	return next
}

// topAt follows the stack at p from the mount parent: the mount at p on
// parent, then the one on top of that, and so on. It returns parent when
// nothing is mounted at p on it.
func (t *Table) topAt(parent int, p string) int {
	for range len(t.layers) {
		next := t.onTop(parent, p)
		if next < 0 {
			return parent
		}
		parent = next
	}
	return parent
}

// resolve returns the index of the mount a lookup of the clean absolute
// path p lands in, walking from the root one component at a time; -1
// when the table has no root.
func (t *Table) resolve(p string) int {
	if t.root < 0 {
		return -1
	}
	cur := t.topAt(t.root, "/")
	if p == "/" {
		return cur
	}
	for i := 1; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			cur = t.topAt(cur, p[:i])
		}
	}
	return cur
}

// Resolve returns the mount a lookup of path lands in: the top of the
// stack at path when something is mounted there, else the mount of the
// nearest ancestor that is visible.
func (t *Table) Resolve(path string) (Layer, bool) {
	i := t.resolve(filepath.Clean(path))
	if i < 0 {
		return Layer{}, false
	}
	return t.layers[i], true
}

// Stack returns the visible stack at path, bottom to top: the mounts at
// path on the mount its parent directory resolves to, each on the one
// below. Empty when nothing visible is mounted at path.
func (t *Table) Stack(path string) []Layer {
	p := filepath.Clean(path)
	if p == "/" {
		if t.root < 0 {
			return nil
		}
		return t.chain(t.root, p, true)
	}
	parent := t.resolve(filepath.Dir(p))
	if parent < 0 {
		return nil
	}
	return t.chain(parent, p, false)
}

// chain lists the mounts at p stacked on from (from itself included when
// self is set), bottom to top.
func (t *Table) chain(from int, p string, self bool) []Layer {
	var out []Layer
	if self {
		out = append(out, t.layers[from])
	}
	cur := from
	for range len(t.layers) {
		next := t.onTop(cur, p)
		if next < 0 {
			break
		}
		out = append(out, t.layers[next])
		cur = next
	}
	return out
}

// At returns every mount whose mount point is path, visible or hidden,
// in table order.
func (t *Table) At(path string) []Layer {
	var out []Layer
	for _, i := range t.at[filepath.Clean(path)] {
		out = append(out, t.layers[i])
	}
	return out
}

// Below returns every mount whose mount point is strictly below path,
// visible or hidden, in table order.
func (t *Table) Below(path string) []Layer {
	p := filepath.Clean(path)
	prefix := p + "/"
	if p == "/" {
		prefix = "/"
	}
	var out []Layer
	for _, l := range t.layers {
		if l.MountPoint != p && strings.HasPrefix(l.MountPoint, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// Visible reports whether the layer with id is on the path a lookup of
// its mount point walks: every mount from it up to the root is the top
// of its stack. A hidden layer (a mount at an ancestor, or on top of it,
// covers it) cannot be reached by its path: unmounting that path would
// unmount something else.
func (t *Table) Visible(id int) bool {
	i, ok := t.byID[id]
	if !ok {
		return false
	}
	return t.resolve(t.layers[i].MountPoint) == i
}

// Covering returns the mount that hides the layer with id from a lookup
// of its mount point: the visible mount the lookup lands in instead. ok
// is false when the layer is visible or not in the table.
func (t *Table) Covering(id int) (Layer, bool) {
	i, ok := t.byID[id]
	if !ok || t.resolve(t.layers[i].MountPoint) == i {
		return Layer{}, false
	}
	j := t.resolve(t.layers[i].MountPoint)
	if j < 0 {
		return Layer{}, false
	}
	// The lookup lands on top of the layer (a mount stacked on it) or in
	// a mount at an ancestor that covers its whole subtree.
	return t.layers[j], true
}
