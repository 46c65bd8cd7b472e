package sysfstest

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Sync changes the tree below dir, which holds the fixture cur (as
// Materialize or an earlier Sync wrote it), into next the way the kernel
// changes sysfs, and returns an error if it cannot:
//
//   - an entry below one of the paths in recreate (the directory or link
//     of a kernel object that was removed and created again under the
//     same name: a new controller that is nvme3 again) is written anew:
//     the new directory is built beside the old one and renamed into
//     place before the old one is removed, so it never has the old inode
//     number, as kernfs guarantees (see Identity); Sync checks that;
//   - an attribute whose value changed is rewritten in place, like a
//     show() that prints something else now;
//   - entries that appeared or disappeared are created or removed;
//   - every directory ends with the mtime its age gives: creating and
//     removing entries changes their parent's mtime on the filesystems
//     tests run on, which kernfs does not do.
//
// now is the capture time ages count back from, as for Materialize.
func Sync(dir string, cur, next *Fixture, recreate []string, now time.Time) error {
	if err := next.Validate(); err != nil {
		return err
	}
	old, nu := index(cur), index(next)
	// A re-created object exists before and after when its entry does, or
	// (a directory the fixture leaves implicit) entries below it do.
	exists := func(m map[string]Entry, r string) (Entry, bool) {
		if e, ok := m[r]; ok {
			return e, true
		}
		for p := range m {
			if strings.HasPrefix(p, r+"/") {
				return Entry{Kind: KindDir, Path: r}, true
			}
		}
		return Entry{}, false
	}
	both := map[string][2]Entry{}
	for _, r := range recreate {
		oe, inOld := exists(old, r)
		ne, inNew := exists(nu, r)
		if inOld && inNew {
			both[r] = [2]Entry{oe, ne}
		}
	}
	// rebuilt reports whether p lies in (or is) a re-created object that
	// exists before and after, whose whole subtree is written anew.
	rebuilt := func(p string) bool {
		for r := range both {
			if p == r || strings.HasPrefix(p, r+"/") {
				return true
			}
		}
		return false
	}
	full := func(p string) string { return filepath.Join(dir, filepath.FromSlash(p)) }

	// Re-created objects that exist before and after, outermost first;
	// one inside another is rebuilt with it.
	var done []string
	for _, r := range slices.Sorted(maps.Keys(both)) {
		if slices.ContainsFunc(done, func(d string) bool { return strings.HasPrefix(r, d+"/") }) {
			continue // rebuilt with the object around it
		}
		done = append(done, r)
		oe, ne := both[r][0], both[r][1]
		if err := recreateEntry(dir, r, oe, ne, next, now); err != nil {
			return fmt.Errorf("sync: re-create %s: %w", r, err)
		}
	}
	// Removals, deepest first (an entry below a removed one is gone with
	// it; RemoveAll does not mind).
	var gone []string
	for p, e := range old {
		ne, ok := nu[p]
		if rebuilt(p) {
			continue
		}
		if !ok || ne.Kind != e.Kind {
			gone = append(gone, p)
		}
	}
	slices.SortFunc(gone, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, p := range gone {
		if err := os.RemoveAll(full(p)); err != nil {
			return fmt.Errorf("sync: remove %s: %w", p, err)
		}
	}
	// Additions and in-place changes, parents first.
	var created []Entry
	for _, e := range next.sorted() {
		if rebuilt(e.Path) {
			continue
		}
		oe, ok := old[e.Path]
		switch {
		case !ok || oe.Kind != e.Kind:
			if err := createEntry(dir, full(e.Path), e); err != nil {
				return fmt.Errorf("sync: create %s: %w", e.Path, err)
			}
			created = append(created, e)
		case e.Kind == KindDir && oe.Age != e.Age:
			created = append(created, e)
		case e.Kind == KindLink && oe.Target != e.Target:
			if err := replaceLink(full(e.Path), e.Target); err != nil {
				return fmt.Errorf("sync: relink %s: %w", e.Path, err)
			}
		case e.Kind != KindDir && e.Kind != KindLink && (oe.Value != e.Value || oe.Mode != e.Mode):
			if err := rewrite(full(e.Path), e); err != nil {
				return fmt.Errorf("sync: rewrite %s: %w", e.Path, err)
			}
		}
	}
	if err := setTimes(dir, created, now); err != nil {
		return err
	}
	return restoreTimes(dir, next, now)
}

// restoreTimes gives every directory of f whose mtime moved the one its
// age says.
func restoreTimes(dir string, f *Fixture, now time.Time) error {
	for _, e := range f.Entries {
		if e.Kind != KindDir {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(e.Path))
		want := now.Add(-e.Age)
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		if !fi.ModTime().Equal(want) {
			if err := os.Chtimes(p, want, want); err != nil {
				return fmt.Errorf("sync: times of %s: %w", e.Path, err)
			}
		}
	}
	return nil
}

// index maps a fixture's paths to its entries.
func index(f *Fixture) map[string]Entry {
	m := make(map[string]Entry, len(f.Entries))
	for _, e := range f.Entries {
		m[e.Path] = e
	}
	return m
}

// sorted returns the entries parents first.
func (f *Fixture) sorted() []Entry {
	s := &Fixture{Entries: slices.Clone(f.Entries)}
	s.Sort()
	return s.Entries
}

// recreateEntry replaces the object at r (a directory with its subtree,
// or a link) by a new one built from next.
func recreateEntry(dir, r string, oe, ne Entry, next *Fixture, now time.Time) error {
	full := filepath.Join(dir, filepath.FromSlash(r))
	if ne.Kind == KindLink {
		if oe.Kind == KindDir {
			if err := os.RemoveAll(full); err != nil {
				return err
			}
			return os.Symlink(ne.Target, full)
		}
		return replaceLink(full, ne.Target)
	}
	before, err := inode(full)
	if err != nil {
		return err
	}
	tmp := full + ".new"
	var sub []Entry
	for _, e := range next.sorted() {
		if e.Path == r || strings.HasPrefix(e.Path, r+"/") {
			sub = append(sub, e)
		}
	}
	for _, e := range sub {
		rel := strings.TrimPrefix(strings.TrimPrefix(e.Path, r), "/")
		if err := createEntry(dir, filepath.Join(tmp, filepath.FromSlash(rel)), e); err != nil {
			return err
		}
	}
	// Times before the rename: the entries are created, and renaming a
	// directory does not change its mtime.
	for i := len(sub) - 1; i >= 0; i-- {
		if e := sub[i]; e.Kind == KindDir {
			rel := strings.TrimPrefix(strings.TrimPrefix(e.Path, r), "/")
			t := now.Add(-e.Age)
			if err := os.Chtimes(filepath.Join(tmp, filepath.FromSlash(rel)), t, t); err != nil {
				return err
			}
		}
	}
	if oe.Kind == KindDir {
		if err := os.Rename(full, full+".old"); err != nil {
			return err
		}
	} else if err := os.Remove(full); err != nil {
		return err
	}
	if err := os.Rename(tmp, full); err != nil {
		return err
	}
	if err := os.RemoveAll(full + ".old"); err != nil {
		return err
	}
	after, err := inode(full)
	if err != nil {
		return err
	}
	if after == before {
		return fmt.Errorf("the new directory has the old one's inode %d", after)
	}
	return nil
}

func inode(p string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// createEntry creates one entry at full, as Materialize does.
func createEntry(dir, full string, e Entry) error {
	if e.Kind == KindLink {
		resolved := path.Join(path.Dir(e.Path), e.Target)
		if resolved == ".." || strings.HasPrefix(resolved, "../") {
			return fmt.Errorf("link target %q leaves the tree", e.Target)
		}
	}
	if e.Kind != KindDir {
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
	}
	return materializeEntry(full, e)
}

// replaceLink points the link at full to target: a new link is made
// beside it and renamed over it.
func replaceLink(full, target string) error {
	tmp := full + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, full)
}

// rewrite writes a changed attribute in place: same file, new content
// and mode.
func rewrite(full string, e Entry) error {
	if err := os.Chmod(full, 0o600); err != nil {
		return err
	}
	value := e.Value
	if e.Kind == KindWriteOnly {
		value = ""
	}
	if err := os.WriteFile(full, []byte(value), 0o600); err != nil {
		return err
	}
	mode := e.Mode.Perm()
	if e.Kind == KindUnreadable {
		mode = 0
	}
	return os.Chmod(full, mode)
}

// setTimes gives the directories among entries their mtimes, children
// first.
func setTimes(dir string, entries []Entry, now time.Time) error {
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Kind != KindDir {
			continue
		}
		t := now.Add(-e.Age)
		if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(e.Path)), t, t); err != nil {
			return fmt.Errorf("sync: times of %s: %w", e.Path, err)
		}
	}
	return nil
}

// Replace makes dir hold f and nothing else, as if the kernel had been
// restarted: every object is new. The new tree is materialized beside dir
// and renamed into place before the old one is removed, so no directory
// keeps an inode number of the old tree (see Identity). dir need not
// exist.
func Replace(dir string, f *Fixture, now time.Time) error {
	tmp := dir + ".new"
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("replace: %w", err)
	}
	if err := f.Materialize(tmp, now); err != nil {
		return fmt.Errorf("replace: %w", err)
	}
	if err := os.Rename(dir, dir+".old"); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("replace: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("replace: %w", err)
	}
	return os.RemoveAll(dir + ".old")
}

// Tree is a fixture materialized in a directory and changed by Sync: a
// test's stand-in for one kernel's sysfs over time.
type Tree struct {
	dir string
	now time.Time
	fx  *Fixture
}

// NewTree materializes f below dir (which must exist and be empty). Ages
// count back from now, for this write and every later Apply.
func NewTree(dir string, f *Fixture, now time.Time) (*Tree, error) {
	if err := f.Materialize(dir, now); err != nil {
		return nil, err
	}
	return &Tree{dir: dir, now: now, fx: f}, nil
}

// FS is the tree, for a reader.
func (t *Tree) FS() sysfs.FS { return sysfs.New(t.dir) }

// Dir is the directory the tree is materialized in.
func (t *Tree) Dir() string { return t.dir }

// Apply changes the tree to show next; see Sync for recreate.
func (t *Tree) Apply(next *Fixture, recreate []string) error {
	if err := Sync(t.dir, t.fx, next, recreate, t.now); err != nil {
		return err
	}
	t.fx = next
	return nil
}
