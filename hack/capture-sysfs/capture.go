package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// classRoot is a directory of class (or block) symlinks pathmend reads.
// Each link matching pattern is recorded and the directory it points at is
// captured; up > 0 also captures the device that many levels above the
// link target (an iSCSI session's class directory sits two levels below
// the session device, which holds the target → LUN → block walk).
type classRoot struct {
	dir     string
	pattern *regexp.Regexp
	up      int
}

var classRoots = []classRoot{
	{dir: "class/nvme", pattern: regexp.MustCompile(`^nvme\d+$`)},
	{dir: "class/nvme-subsystem", pattern: regexp.MustCompile(`^nvme-subsys\d+$`)},
	{dir: "block", pattern: regexp.MustCompile(`^(nvme\d+n\d+|dm-\d+|sd[a-z]+)$`)},
	{dir: "class/iscsi_host", pattern: regexp.MustCompile(`^host\d+$`), up: 2},
	{dir: "class/iscsi_session", pattern: regexp.MustCompile(`^session\d+$`), up: 2},
	{dir: "class/iscsi_connection", pattern: regexp.MustCompile(`^connection\d+:\d+$`)},
}

// singleAttrs are attributes captured on their own, with their ancestors.
var singleAttrs = []string{
	"module/nvme_core/parameters/multipath",
}

// skipNames are directory entries never captured below a followed device:
// per-CPU queues, block-layer tuning, power management, tracing and the
// character-device twins pathmend does not read. uevent is skipped as
// noise (its content repeats the directory's identity).
var skipNames = map[string]bool{
	"power":         true,
	"uevent":        true,
	"queue":         true,
	"mq":            true,
	"trace":         true,
	"integrity":     true,
	"bsg":           true,
	"scsi_generic":  true,
	"firmware_node": true,
}

// skipPatterns are skipped like skipNames: NVMe generic char devices
// (ng0n1) and hwmon nodes.
var skipPatterns = []*regexp.Regexp{
	regexp.MustCompile(`^ng\d+n\d+$`),
	regexp.MustCompile(`^hwmon\d+$`),
}

// maxDepth bounds the walk below a followed class link target:
// session → target → LUN → block → sdX → holders is 5 levels.
const maxDepth = 6

// maxAttr bounds one attribute read (a sysfs attribute is one page).
const maxAttr = 4096

// capturer walks a sysfs tree rooted at root into fixture entries.
type capturer struct {
	root    string
	now     time.Time
	entries map[string]sysfstest.Entry
	walked  map[string]bool
}

// capture snapshots the subtrees pathmend reads below root. now is the
// capture time that directory ages are relative to.
func capture(root string, now time.Time) (*sysfstest.Fixture, error) {
	c := &capturer{root: root, now: now, entries: map[string]sysfstest.Entry{}, walked: map[string]bool{}}
	for _, cr := range classRoots {
		if err := c.classDir(cr); err != nil {
			return nil, err
		}
	}
	for _, a := range singleAttrs {
		if _, err := os.Lstat(c.full(a)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := c.ancestors(a); err != nil {
			return nil, err
		}
		if err := c.node(a, 0); err != nil {
			return nil, err
		}
	}
	f := &sysfstest.Fixture{}
	for _, e := range c.entries {
		f.Entries = append(f.Entries, e)
	}
	f.Sort()
	return f, nil
}

func (c *capturer) full(rel string) string {
	return filepath.Join(c.root, filepath.FromSlash(rel))
}

func (c *capturer) classDir(cr classRoot) error {
	names, err := readDirNames(c.full(cr.dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the module is not loaded: nothing to capture
	}
	if err != nil {
		return err
	}
	if err := c.ancestors(cr.dir); err != nil {
		return err
	}
	if err := c.dir(cr.dir); err != nil {
		return err
	}
	for _, name := range names {
		if !cr.pattern.MatchString(name) {
			continue
		}
		rel := cr.dir + "/" + name
		fi, err := os.Lstat(c.full(rel))
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			// Not a class link (a hand-made tree): capture it in place.
			if err := c.walk(rel, 0); err != nil {
				return err
			}
			continue
		}
		target, err := c.link(rel)
		if err != nil {
			return err
		}
		follow := []string{target}
		dev := target
		for i := 0; i < cr.up; i++ {
			dev = path.Dir(dev)
		}
		if dev != target && dev != "." {
			follow = []string{dev, target}
		}
		for _, t := range follow {
			if err := c.ancestors(t); err != nil {
				return err
			}
			if err := c.walk(t, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// link records the symlink at rel and returns its target resolved to a
// root-relative path. A target outside the root is an error.
func (c *capturer) link(rel string) (string, error) {
	t, err := os.Readlink(c.full(rel))
	if err != nil {
		return "", err
	}
	c.entries[rel] = sysfstest.Entry{Kind: sysfstest.KindLink, Path: rel, Target: t}
	resolved := path.Join(path.Dir(rel), t)
	if path.IsAbs(t) || resolved == ".." || strings.HasPrefix(resolved, "../") {
		return "", fmt.Errorf("link %s -> %s leaves the sysfs root", rel, t)
	}
	return resolved, nil
}

// ancestors records the directories above rel (not their contents).
func (c *capturer) ancestors(rel string) error {
	var chain []string
	for p := path.Dir(rel); p != "."; p = path.Dir(p) {
		chain = append(chain, p)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if _, ok := c.entries[chain[i]]; ok {
			continue
		}
		if err := c.dir(chain[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *capturer) dir(rel string) error {
	fi, err := os.Lstat(c.full(rel))
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: expected a directory, found %s", rel, fi.Mode().Type())
	}
	age := c.now.Sub(fi.ModTime()).Round(time.Millisecond)
	if age < 0 {
		age = 0
	}
	c.entries[rel] = sysfstest.Entry{Kind: sysfstest.KindDir, Path: rel, Age: age}
	return nil
}

// walk records the directory rel and everything below it to maxDepth,
// recording symlinks without following them.
func (c *capturer) walk(rel string, depth int) error {
	if c.walked[rel] {
		return nil
	}
	c.walked[rel] = true
	if err := c.dir(rel); err != nil {
		return err
	}
	names, err := readDirNames(c.full(rel))
	if err != nil {
		return err
	}
	for _, name := range names {
		if skip(name) {
			continue
		}
		if err := c.node(rel+"/"+name, depth); err != nil {
			return err
		}
	}
	return nil
}

func skip(name string) bool {
	if skipNames[name] {
		return true
	}
	for _, re := range skipPatterns {
		if re.MatchString(name) {
			return true
		}
	}
	return false
}

// node records one entry found in a walked directory.
func (c *capturer) node(rel string, depth int) error {
	fi, err := os.Lstat(c.full(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // vanished while walking (a controller being deleted)
	}
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(c.full(rel))
		if err != nil {
			return err
		}
		c.entries[rel] = sysfstest.Entry{Kind: sysfstest.KindLink, Path: rel, Target: t}
	case fi.IsDir():
		if depth+1 > maxDepth {
			return c.dir(rel)
		}
		return c.walk(rel, depth+1)
	case fi.Mode().IsRegular():
		c.entries[rel] = c.attr(rel, fi.Mode().Perm())
	}
	return nil
}

// attr reads one attribute. An attribute without read permission is
// write-only (delete_controller); a mode-0000 file is an unreadable
// attribute of a materialized fixture, whose content is the error name
// (recorded with mode 0444: the attributes whose reads fail are
// read-only ones, like a down connection's address).
func (c *capturer) attr(rel string, perm fs.FileMode) sysfstest.Entry {
	e := sysfstest.Entry{Path: rel, Mode: perm}
	if perm == 0 {
		b, err := readBounded(c.full(rel))
		e.Mode = 0o444
		e.Kind, e.Value = sysfstest.KindUnreadable, strings.TrimSpace(string(b))
		if err != nil || e.Value == "" {
			e.Value = errName(err)
		}
		return e
	}
	if perm&0o444 == 0 {
		e.Kind = sysfstest.KindWriteOnly
		return e
	}
	b, err := readBounded(c.full(rel))
	if err != nil {
		e.Kind, e.Value = sysfstest.KindUnreadable, errName(err)
		return e
	}
	e.Kind, e.Value = sysfstest.KindFile, string(b)
	return e
}

func readBounded(name string) ([]byte, error) {
	fh, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxAttr+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxAttr {
		return nil, errTooLarge
	}
	return b, nil
}

var errTooLarge = errors.New("attribute larger than one page")

// errName turns a read error into the stable name a fixture records:
// the errno name (ENOTCONN, EIO, …) or TOOLARGE.
func errName(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "EUNKNOWN"
	case errors.Is(err, errTooLarge):
		return "TOOLARGE"
	case errors.As(err, &errno):
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("ERRNO%d", int(errno))
	}
	return "EUNKNOWN"
}

func readDirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}
