package iscsi

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// fixtureDir is where the lab's captures live.
const fixtureDir = "../../testdata/fixtures"

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// capture materializes a lab capture and returns an FS rooted at it.
func capture(t testing.TB, name string) sysfs.FS {
	t.Helper()
	dir := t.TempDir()
	if err := sysfstest.Materialize(filepath.Join(fixtureDir, name+".sysfs"), dir, t0); err != nil {
		t.Fatal(err)
	}
	return sysfs.New(dir)
}

// captures caches the snapshot of each lab capture: snapshots are
// immutable, so tests share them (and change copies: withState).
var captures struct {
	sync.Mutex
	m map[string]*Snapshot
}

// readCapture reads a lab capture (once per test binary).
func readCapture(t testing.TB, name string) *Snapshot {
	t.Helper()
	captures.Lock()
	defer captures.Unlock()
	if s, ok := captures.m[name]; ok {
		return s
	}
	s, err := Read(capture(t, name), t0)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	if captures.m == nil {
		captures.m = map[string]*Snapshot{}
	}
	captures.m[name] = s
	return s
}

// tree writes a synthetic topology and returns its FS and directory.
func tree(t testing.TB, top iscsitest.Topology) (sysfs.FS, string) {
	t.Helper()
	dir := t.TempDir()
	if err := top.Write(dir); err != nil {
		t.Fatal(err)
	}
	return sysfs.New(dir), dir
}

// twoPortals is a target with LUN 0 behind two portals and a map over both
// disks, like the healthy capture.
func twoPortals() iscsitest.Topology {
	return iscsitest.Topology{
		Sessions: []iscsitest.Session{
			{ID: 1, Host: 0, Target: "iqn.2024-01.io.example:t", Address: "127.0.0.1", TPGT: 1, RecoveryTmo: 5,
				LUNs: []iscsitest.LUN{{LUN: 0, Disk: "sda", WWID: "naa.6001405aaaa", Minor: 0}}},
			{ID: 2, Host: 1, Target: "iqn.2024-01.io.example:t", Address: "127.0.0.2", TPGT: 1, RecoveryTmo: 5,
				LUNs: []iscsitest.LUN{{LUN: 0, Disk: "sdb", WWID: "naa.6001405aaaa", Minor: 16}}},
		},
		Maps: []iscsitest.Map{{Device: "dm-0", Name: "36001405aaaa", Slaves: []string{"sda", "sdb"}}},
	}
}

// readWO reads back what was written to a write-only attribute.
func readWO(t testing.TB, root, rel string) string {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
