package nvme

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// testNow is the write time of every generated or materialized tree, so
// that CreatedAt values are exact.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// materialize writes f into a fresh temporary directory and returns an FS
// rooted there.
func materialize(t testing.TB, f *sysfstest.Fixture) sysfs.FS {
	t.Helper()
	dir := t.TempDir()
	if err := f.Materialize(dir, testNow); err != nil {
		t.Fatal(err)
	}
	return sysfs.New(dir)
}

// readTopology writes topo and reads it back.
func readTopology(t testing.TB, topo nvmetest.Topology) *Host {
	t.Helper()
	return mustRead(t, materialize(t, topo.Fixture()))
}

func mustRead(t testing.TB, fsys sysfs.FS) *Host {
	t.Helper()
	h, err := Read(fsys)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return h
}

// without drops the entries at each path and everything below them.
func without(f *sysfstest.Fixture, paths ...string) *sysfstest.Fixture {
	out := &sysfstest.Fixture{Comments: f.Comments}
	for _, e := range f.Entries {
		if !slices.ContainsFunc(paths, func(p string) bool { return e.Path == p || strings.HasPrefix(e.Path, p+"/") }) {
			out.Entries = append(out.Entries, e)
		}
	}
	return out
}

// withValue returns f with the file at path holding value (plus the
// kernel's newline), adding the file when it is missing.
func withValue(f *sysfstest.Fixture, path, value string) *sysfstest.Fixture {
	out := without(f, path)
	out.Entries = append(out.Entries, sysfstest.Entry{Kind: sysfstest.KindFile, Path: path, Mode: 0o444, Value: value + "\n"})
	out.Sort()
	return out
}

// ctl is the device directory of controller instance n in a generated tree.
func ctl(n int) string { return "devices/virtual/nvme-fabrics/ctl/nvme" + itoa(n) }

// subsysDev is the device directory of subsystem instance n.
func subsysDev(n int) string { return "devices/virtual/nvme-subsystem/nvme-subsys" + itoa(n) }

func itoa(n int) string { return strconv.Itoa(n) }

// legs maps every head in heads to state, for nvmetest.Controller.Legs.
func legs(state string, heads ...int) map[int]string {
	m := make(map[int]string, len(heads))
	for _, h := range heads {
		m[h] = state
	}
	return m
}
