package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Ownership by layer. A path can hold a stack of mounts, and only some of
// them are pathmend's: NodeStage's mount of the volume's device at the
// staging path, NodePublish's bind of the staging mount (or of the device
// node) at a target path. Each is recorded in the volume's record as it is
// made (volume.MountLayer: mount ID, parent, device number, root,
// filesystem type, source, in which mount namespace of which boot), and
// pathmend unmounts a layer only when it is one of those:
//
//   - a layer recorded before its mount was made (ID 0: the intent,
//     written before the mount so that a crash right after it leaves a
//     record that names the mount) must show the device number (or, when
//     that is not known in advance, the source), the root and the
//     filesystem type recorded;
//   - read in the recorded namespace of the recorded boot, the layer must
//     be the recorded mount in every field;
//   - in another mount namespace of the same boot (the plugin container
//     restarted: its copy of every mount has a new ID) it must agree in
//     every field a mount keeps across namespaces: device number, root,
//     filesystem type and source;
//   - with no layer recorded (a crash between the mount and the record, a
//     record written before layers were kept) or one recorded in another
//     boot, it must be what pathmend makes there: a filesystem on the
//     volume's device, or the bind of it, or of its device node.
//
// Any other layer at the path, on top of the volume's, under it, inside
// it or covering it, makes the call FailedPrecondition naming the layer's
// filesystem type and source; nothing is unmounted and nothing removed.

// layerView is one read of the mount table and the namespace its mount
// IDs are valid in.
type layerView struct {
	tb *mounts.Table
	ns mounts.Namespace
}

// layers reads the mount table's layers (Deps.MountTable: kept between
// changes, so a call on a quiet node does not parse the whole table).
func (d *Driver) layers() (layerView, error) {
	ns, err := d.deps.MountNamespace()
	if err != nil {
		return layerView{}, internal(err, "read the mount namespace")
	}
	tb, err := d.deps.MountTable()
	if err != nil {
		return layerView{}, internal(err, "read the mount table")
	}
	return layerView{tb: tb, ns: ns}, nil
}

// canonical returns p with the symlinks of its existing part resolved,
// as the mount table lists mount points.
func canonical(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	dir, base := filepath.Split(p)
	if dir == "" || dir == "/" || base == "" {
		return p
	}
	return filepath.Join(canonical(filepath.Clean(dir)), base)
}

// claim is what of the layers at one path is a volume's.
type claim struct {
	// what names the path in messages: "staging path", "target path".
	what string
	// path is canonical.
	path string
	// rec is the layer the record names there, if any.
	rec *volume.MountLayer
	// like reports whether a layer is what pathmend makes there; nil
	// when pathmend makes nothing there.
	like func(mounts.Layer) bool
}

// ours reports whether l is the volume's layer (see the rule above).
func (c claim) ours(v layerView, l mounts.Layer) bool {
	r := c.rec
	switch {
	case r == nil || (r.ID != 0 && r.Boot != v.ns.Boot):
		return c.like != nil && c.like(l)
	case r.ID == 0:
		return shaped(l, *r)
	case r.Namespace == v.ns.Mount:
		return l.Is(*r, v.ns)
	}
	return shaped(l, *r) && l.Dev == r.Dev && l.Source == r.Source
}

// shaped reports whether l shows what r says a mount will show: its
// device number (its source when the number is not known in advance),
// its root and its filesystem type.
func shaped(l mounts.Layer, r volume.MountLayer) bool {
	if !r.Dev.IsZero() {
		if l.Dev != r.Dev {
			return false
		}
	} else if l.Source != r.Source {
		return false
	}
	return mounts.SameRoot(l.Root, r.Root) && (r.FSType == "" || l.FSType == r.FSType)
}

// exact reports whether the recorded layer is l itself, so the record
// need not be written again.
func (c claim) exact(v layerView, l mounts.Layer) bool {
	return c.rec != nil && c.rec.ID != 0 && l.Is(*c.rec, v.ns)
}

// pendingStaging is the staging layer NodeStage records before it mounts
// rec's device: what the mount will show.
func pendingStaging(rec volume.Record) *volume.MountLayer {
	dev := rec.DevNum
	if n, ok := rdevOf(rec.Device); ok {
		dev = n
	}
	return &volume.MountLayer{Dev: dev, Root: "/", FSType: rec.FSType, Source: rec.Device}
}

// pendingBind is the publication layer NodePublish records before it
// binds: a bind shows the filesystem of its source and the source's path
// in it — the staging mount's, or the device node's in /dev's filesystem.
func pendingBind(rec volume.Record, v layerView) (*volume.MountLayer, bool) {
	src := canonical(rec.StagingPath)
	if rec.AccessType == volume.AccessBlock {
		src = canonical(rec.Device)
	}
	in, ok := v.tb.Resolve(src)
	if !ok {
		return nil, false
	}
	root := filepath.Join(in.Root, strings.TrimPrefix(src, in.MountPoint))
	if in.MountPoint == "/" {
		root = filepath.Join(in.Root, src)
	}
	return &volume.MountLayer{Dev: in.Dev, Root: root, FSType: in.FSType, Source: in.Source}, true
}

// standing is what stands at a claimed path.
type standing struct {
	// stack is the visible stack at the path, bottom to top; when
	// foreign is nil, every layer in it is the volume's.
	stack []mounts.Layer
	// foreign is the first layer that is not the volume's and stands in
	// the way; how says where.
	foreign *mounts.Layer
	how     string
}

// top is the top of the stack; ok is false when nothing is mounted.
func (s standing) top() (mounts.Layer, bool) {
	if len(s.stack) == 0 {
		return mounts.Layer{}, false
	}
	return s.stack[len(s.stack)-1], true
}

// inspect classifies the layers at c.path: a layer in the visible stack
// that is not the volume's; a mount inside one of the volume's layers;
// a mount covering a layer of the volume's that no lookup of the path
// reaches any more.
func (c claim) inspect(v layerView) standing {
	s := standing{stack: v.tb.Stack(c.path)}
	isOurs := func(l mounts.Layer) bool { return c.ours(v, l) }
	for i, l := range s.stack {
		if isOurs(l) {
			continue
		}
		s.foreign = &s.stack[i]
		switch {
		case slices.ContainsFunc(s.stack[:i], isOurs):
			s.how = "on top of the volume's mount"
		case slices.ContainsFunc(s.stack[i+1:], isOurs):
			s.how = "under the volume's mount"
		default:
			s.how = "and nothing of the volume is mounted there"
		}
		return s
	}
	for _, l := range s.stack {
		for _, ch := range v.tb.Children(l.ID) {
			if ch.MountPoint != l.MountPoint {
				s.foreign, s.how = &ch, "inside the volume's mount, at "+ch.MountPoint
				return s
			}
		}
	}
	for _, l := range v.tb.At(c.path) {
		if slices.ContainsFunc(s.stack, func(x mounts.Layer) bool { return x.ID == l.ID }) || !isOurs(l) {
			continue
		}
		if cov, ok := v.tb.Covering(l.ID); ok {
			s.foreign, s.how = &cov, "covering the volume's mount (mounted at "+cov.MountPoint+")"
			return s
		}
	}
	return s
}

// foreignError is the FailedPrecondition of a foreign layer at a path of
// volumeID: it names the layer's filesystem type and source, and says
// that nothing was unmounted or removed.
func foreignError(volumeID string, c claim, s standing) error {
	return failedPrecondition("%s %s of volume %s holds a mount that is not the volume's: %s, %s; nothing was unmounted or removed",
		c.what, quoteShort(c.path), volumeID, s.foreign, s.how)
}

// release unmounts the volume's layers at c.path, top first, when nothing
// foreign stands there (inspect); otherwise it unmounts nothing and
// returns foreignError. It returns how many layers it unmounted.
func (d *Driver) release(ctx context.Context, volumeID string, c claim) (int, error) {
	v, err := d.layers()
	if err != nil {
		return 0, err
	}
	s := c.inspect(v)
	if s.foreign != nil {
		return 0, foreignError(volumeID, c, s)
	}
	n := 0
	for i := len(s.stack) - 1; i >= 0; i-- {
		if err := d.unmountLayer(ctx, volumeID, s.stack[i]); err != nil {
			if ce := (*codedError)(nil); errors.As(err, &ce) {
				return n, err // still in the kernel: Aborted, naming the call
			}
			if errors.Is(err, mounts.ErrNotTop) {
				return n, failedPrecondition("%s %s of volume %s: the mounts there changed during the call (%v); %d of the volume's layers were unmounted", c.what, quoteShort(c.path), volumeID, err, n)
			}
			return n, internal(err, "unmount %s", s.stack[i])
		}
		n++
	}
	return n, nil
}

// newTop finds the layer a mount this call made at c.path: the top of
// the stack after it, when it was not in the table before (isNew). made
// says whether it is the mount the call made — what the claim expects
// there, or at least of the source the call mounted — and not someone
// else's mounted at the same instant.
func newTop(before, after layerView, c claim, source string) (l mounts.Layer, isNew, made bool) {
	s := after.tb.Stack(c.path)
	if len(s) == 0 {
		return mounts.Layer{}, false, false
	}
	top := s[len(s)-1]
	if old, ok := before.tb.Layer(top.ID); ok && old.MountPoint == top.MountPoint && old.Parent == top.Parent {
		return mounts.Layer{}, false, false
	}
	return top, true, c.ours(after, top) || (source != "" && top.Source == source)
}

// onDevice reports whether a filesystem of device number dev and mount
// source source is on rec's device: by the number the record keeps, else
// by the device node's, else (a device without a node number: only in
// tests) by the source.
func onDevice(rec volume.Record, dev volume.DeviceNumber, source string) bool {
	if !rec.DevNum.IsZero() {
		return dev == rec.DevNum
	}
	if n, ok := rdevOf(rec.Device); ok {
		return dev == n
	}
	return rec.Device != "" && source == rec.Device
}

// stagedFrom reports whether l is what NodeStage mounts for rec, or a bind
// of it, which NodePublish makes: the root of a filesystem of rec's
// filesystem type on rec's device.
func stagedFrom(rec volume.Record, l mounts.Layer) bool {
	return l.Root == "/" && (rec.FSType == "" || l.FSType == rec.FSType) && onDevice(rec, l.Dev, l.Source)
}

// stagingClaim is the volume's layer at its staging path: the mount of
// its device, for filesystem access; nothing for block access.
func stagingClaim(rec volume.Record) claim {
	c := claim{what: "staging path", path: canonical(rec.StagingPath), rec: rec.StagingLayer}
	if rec.AccessType == volume.AccessMount {
		c.like = func(l mounts.Layer) bool { return stagedFrom(rec, l) }
	}
	return c
}

// publicationClaim is the volume's layer at publication p: the bind of the
// staging mount (filesystem access) or of the device node (block access).
func publicationClaim(rec volume.Record, p volume.Publication, v layerView) claim {
	c := claim{what: "target path", path: canonical(p.TargetPath), rec: p.Layer}
	if rec.AccessType == volume.AccessMount {
		c.like = func(l mounts.Layer) bool { return stagedFrom(rec, l) }
		return c
	}
	// A bind of the device node shows the filesystem the node is in and
	// the node's path in it; a node the kernel removed since shows
	// "//deleted" after it.
	dev := canonical(rec.Device)
	in, ok := v.tb.Resolve(dev)
	if rec.Device == "" || !ok {
		return c
	}
	root := filepath.Join(in.Root, strings.TrimPrefix(dev, in.MountPoint))
	if in.MountPoint == "/" {
		root = filepath.Join(in.Root, dev)
	}
	c.like = func(l mounts.Layer) bool {
		return l.Dev == in.Dev && l.FSType == in.FSType && (l.Root == root || l.Root == root+"//deleted")
	}
	return c
}

// unclaimed is a path where pathmend made nothing for the volume: every
// layer there is foreign.
func unclaimed(what, path string) claim { return claim{what: what, path: canonical(path)} }

// publishedAt reports whether the volume's layer is mounted at p, visible
// or not.
func publishedAt(rec volume.Record, p volume.Publication, v layerView) bool {
	c := publicationClaim(rec, p, v)
	return slices.ContainsFunc(v.tb.At(c.path), func(l mounts.Layer) bool { return c.ours(v, l) })
}

// emptyPlace checks that a mount at path hides nothing: path does not
// exist, or is an empty directory (wantDir) or an empty regular file,
// not a symlink, and nothing is mounted below it. exists reports whether
// it existed.
func emptyPlace(v layerView, field, path string, wantDir bool) (exists bool, err error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, internal(err, "stat %s", path)
	case fi.Mode()&os.ModeSymlink != 0:
		return true, invalidArgument("%s %s is a symbolic link; pathmend mounts only at a directory or file kubelet named", field, quoteShort(path))
	case wantDir && !fi.IsDir():
		return true, failedPrecondition("%s %s exists and is not a directory", field, quoteShort(path))
	case !wantDir && !fi.Mode().IsRegular():
		return true, failedPrecondition("%s %s exists and is not a regular file (a block volume is bound onto a file)", field, quoteShort(path))
	case !wantDir && fi.Size() > 0:
		return true, failedPrecondition("%s %s is a file of %d bytes; a mount there would hide it", field, quoteShort(path), fi.Size())
	}
	if below := v.tb.Below(canonical(path)); len(below) > 0 {
		return true, failedPrecondition("%s %s holds the mount %s at %s; a mount over it would hide it", field, quoteShort(path), below[0], below[0].MountPoint)
	}
	if wantDir {
		f, err := os.Open(path)
		if err != nil {
			return true, internal(err, "open %s", path)
		}
		names, _ := f.Readdirnames(1)
		f.Close()
		if len(names) > 0 {
			return true, failedPrecondition("%s %s is not empty (it holds %q); a mount over it would hide its content", field, quoteShort(path), names[0])
		}
	}
	return true, nil
}

// removeCreated removes the directory or file NodePublish created at
// path, when it is empty and nothing is mounted there; anything else is
// left as it is.
func removeCreated(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return internal(err, "stat %s", path)
	case fi.Mode().IsRegular() && fi.Size() > 0, !fi.IsDir() && !fi.Mode().IsRegular():
		return nil
	}
	// os.Remove deletes a file or an empty directory, never anything with
	// content.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return nil
		}
		return internal(err, "remove %s", path)
	}
	return nil
}

// checkContainingMount refuses a path that lies inside a mount pathmend
// made for a volume: a staging mount or a publication. The mount a lookup
// of path's parent lands in is one only when it is below the kubelet root
// (kubelet's own directories are on the root's filesystem), so only then
// are the records read.
func (d *Driver) checkContainingMount(v layerView, field, path string) error {
	in, ok := v.tb.Resolve(filepath.Dir(canonical(path)))
	if !ok || in.MountPoint == "/" {
		return nil
	}
	if root := d.cfg.KubeletRoot; root != "" && (in.MountPoint == canonical(root) || !within(canonical(root), in.MountPoint)) {
		return nil
	}
	return d.checkNotVolumePath(field, path, in.MountPoint, "lies inside")
}

// checkNotVolumePath refuses path when p (path itself, or the mount point
// path lies inside) is any volume's staging path or publication. It reads
// every record: callers use it only off the common path.
func (d *Driver) checkNotVolumePath(field, path, p, how string) error {
	ls, err := d.deps.Intents.Scan()
	if err != nil {
		return internal(err, "read the staged-volume records")
	}
	for _, r := range ls.Records {
		if r.StagingPath != "" && canonical(r.StagingPath) == p {
			return invalidArgument("%s %s %s the staging path of volume %s", field, quoteShort(path), how, r.VolumeID)
		}
		for _, pub := range r.Publications {
			if canonical(pub.TargetPath) == p {
				return invalidArgument("%s %s %s a publication of volume %s", field, quoteShort(path), how, r.VolumeID)
			}
		}
	}
	return nil
}

// relation says how two clean absolute paths lie: "is", "lies inside",
// "contains", or "" when neither is inside the other.
func relation(a, b string) string {
	switch {
	case a == b:
		return "is"
	case within(b, a):
		return "lies inside"
	case within(a, b):
		return "contains"
	}
	return ""
}
