package sysfstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// dirFixture is one controller with a leg, linked from its class.
const dirFixture = FixtureMagic + `
dir devices/virtual/nvme-fabrics/ctl/nvme0 1s
file devices/virtual/nvme-fabrics/ctl/nvme0/state 0444 "live\n"
file devices/virtual/nvme-fabrics/ctl/nvme0/model 0444 "pathmend-lab                            \n"
dir devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1 2s
file devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1/ana_state 0444 "optimized\n"
dir class/nvme 3s
link class/nvme/nvme0 ../../devices/virtual/nvme-fabrics/ctl/nvme0
`

func TestSync_RewritesInPlaceAndRecreatesWithNewInodes(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cur := mustParse(t, dirFixture)
	if err := cur.Materialize(dir, now); err != nil {
		t.Fatal(err)
	}
	ctrl := "devices/virtual/nvme-fabrics/ctl/nvme0"
	ino := func(rel string) uint64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, rel), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	stateIno, ctrlIno, legIno := ino(ctrl+"/state"), ino(ctrl), ino(ctrl+"/nvme0c0n1")

	// A state change and a new leg: the attribute keeps its inode, the
	// controller directory keeps its inode and its mtime.
	next := mustParse(t, FixtureMagic+`
dir devices/virtual/nvme-fabrics/ctl/nvme0 1s
file devices/virtual/nvme-fabrics/ctl/nvme0/state 0444 "connecting\n"
file devices/virtual/nvme-fabrics/ctl/nvme0/model 0444 "pathmend-lab                            \n"
dir devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1 2s
file devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1/ana_state 0444 "inaccessible\n"
dir devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n2 1s
file devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n2/ana_state 0444 "optimized\n"
dir class/nvme 3s
link class/nvme/nvme0 ../../devices/virtual/nvme-fabrics/ctl/nvme0
`)
	if err := Sync(dir, cur, next, nil, now); err != nil {
		t.Fatal(err)
	}
	fsys := sysfs.New(dir)
	if v, _ := fsys.ReadAttr("class/nvme/nvme0/state"); v != "connecting" || ino(ctrl+"/state") != stateIno {
		t.Errorf("state = %q (inode %d, was %d): want rewritten in place", v, ino(ctrl+"/state"), stateIno)
	}
	if v, _ := fsys.ReadAttr("class/nvme/nvme0/nvme0c0n2/ana_state"); v != "optimized" {
		t.Errorf("new leg ana_state = %q", v)
	}
	fi, _ := fsys.Stat("class/nvme/nvme0")
	if ino(ctrl) != ctrlIno || !fi.ModTime().Equal(now.Add(-time.Second)) {
		t.Errorf("controller directory: inode %d (was %d), mtime %s: want both kept", ino(ctrl), ctrlIno, fi.ModTime())
	}

	// The same name, a new controller: every inode below is new.
	if err := Sync(dir, next, cur, []string{ctrl, "class/nvme/nvme0"}, now); err != nil {
		t.Fatal(err)
	}
	if ino(ctrl) == ctrlIno || ino(ctrl+"/nvme0c0n1") == legIno {
		t.Errorf("re-created controller kept an inode: %d/%d, leg %d/%d", ino(ctrl), ctrlIno, ino(ctrl+"/nvme0c0n1"), legIno)
	}
	if _, err := os.Lstat(filepath.Join(dir, ctrl, "nvme0c0n2")); !os.IsNotExist(err) {
		t.Errorf("the old controller's leg survived the re-creation: %v", err)
	}
	if v, _ := fsys.ReadAttr("class/nvme/nvme0/state"); v != "live" {
		t.Errorf("state of the new controller = %q", v)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "devices/virtual/nvme-fabrics/ctl"))
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}
