package sysfs_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

const dirFixture = sysfstest.FixtureMagic + `
dir devices/virtual/nvme-fabrics/ctl/nvme0 1s
file devices/virtual/nvme-fabrics/ctl/nvme0/state 0444 "live\n"
file devices/virtual/nvme-fabrics/ctl/nvme0/model 0444 "pathmend-lab                            \n"
dir devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1 2s
file devices/virtual/nvme-fabrics/ctl/nvme0/nvme0c0n1/ana_state 0444 "optimized\n"
dir class/nvme 3s
link class/nvme/nvme0 ../../devices/virtual/nvme-fabrics/ctl/nvme0
`

func TestDir_ListsReadsAndStatsRelativeToTheOpenDirectory(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := mustParseFixture(t, dirFixture).Materialize(dir, now); err != nil {
		t.Fatal(err)
	}
	r := sysfs.NewAttrReader(sysfs.New(dir))
	root := r.OpenRoot()
	defer root.Close()
	d, err := root.OpenDir("class/nvme/nvme0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Rel() != "class/nvme/nvme0" {
		t.Errorf("Rel = %q", d.Rel())
	}
	if got, want := d.Identity().ModTime(), now.Add(-time.Second); !got.Equal(want) {
		t.Errorf("mtime through the class link = %s, want %s", got, want)
	}
	names, err := d.Names(nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"model", "nvme0c0n1", "state"}, names); d != "" {
		t.Errorf("Names (-want +got):\n%s", d)
	}
	// Unchanged: the previous listing itself comes back.
	again, err := d.Names(names)
	if err != nil || &again[0] != &names[0] {
		t.Errorf("an unchanged directory gave a new listing: %v", err)
	}
	for name, want := range map[string]string{"state": "live", "model": "pathmend-lab", "nvme0c0n1/ana_state": "optimized"} {
		if b, err := d.ReadAttr(name); err != nil || string(b) != want {
			t.Errorf("ReadAttr(%s) = %q, %v; want %q", name, b, err, want)
		}
	}
	_, err = d.ReadAttr("absent")
	if !sysfs.IsNotExist(err) || !strings.Contains(err.Error(), "read class/nvme/nvme0/absent:") {
		t.Errorf("missing attribute: %v", err)
	}
	if _, ok, err := d.ReadOptionalAttr("absent"); ok || err != nil {
		t.Errorf("missing optional attribute: ok=%t err=%v", ok, err)
	}
	leg, err := d.Stat("nvme0c0n1")
	if err != nil || !leg.ModTime().Equal(now.Add(-2*time.Second)) {
		t.Errorf("Stat(leg) = %+v, %v", leg, err)
	}
	if _, err := d.Stat("nvme0c0n9"); !sysfs.IsNotExist(err) {
		t.Errorf("Stat of a missing entry: %v", err)
	}
	if _, err := root.OpenDir("class/nvme/nvme7"); !sysfs.IsNotExist(err) || !strings.Contains(err.Error(), "list class/nvme/nvme7:") {
		t.Errorf("OpenDir of a missing directory: %v", err)
	}
	if id, err := r.FS().Identity("class/nvme/nvme0"); err != nil || id != d.Identity() {
		t.Errorf("FS.Identity = %+v, %v; the open directory has %+v", id, err, d.Identity())
	}
	if c := r.Counts(); c != (sysfs.Counts{Reads: 5, Lists: 1, Stats: 2}) {
		t.Errorf("Counts = %+v", c)
	}

	// A listing that changed reuses the strings it still holds.
	if err := os.WriteFile(filepath.Join(dir, "devices/virtual/nvme-fabrics/ctl/nvme0/cntlid"), []byte("1\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	changed, err := d.Names(names)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"cntlid", "model", "nvme0c0n1", "state"}, changed); d != "" {
		t.Errorf("Names after a change (-want +got):\n%s", d)
	}
	if &changed[0] == &names[0] || strings.Clone(changed[1]) != names[0] {
		t.Errorf("changed listing %q, previous %q", changed, names)
	}
}

func TestDir_RootThatCannotBeOpenedResolvesPaths(t *testing.T) {
	r := sysfs.NewAttrReader(sysfs.New(filepath.Join(t.TempDir(), "absent")))
	root := r.OpenRoot()
	defer root.Close()
	if _, err := root.OpenDir("class/nvme"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("OpenDir below a missing root: %v", err)
	}
}

// Names refuses nothing a directory can hold and a long listing needs
// several getdents calls: the names of 600 entries come back sorted.
func TestDir_NamesOfALargeDirectory(t *testing.T) {
	dir := t.TempDir()
	var want []string
	for i := range 600 {
		n := "attribute-with-a-long-name-" + strings.Repeat("x", i%40) + "-" + itoa3(i)
		want = append(want, n)
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	d, err := sysfs.NewAttrReader(sysfs.New(dir)).OpenDir(".")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := d.Names(nil)
	if err != nil {
		t.Fatal(err)
	}
	fsNames, _ := sysfs.New(dir).ReadDir(".")
	if d := cmp.Diff(fsNames, got); d != "" || len(got) != len(want) {
		t.Errorf("Names differs from FS.ReadDir (-ReadDir +Names):\n%s", d)
	}
}

func itoa3(i int) string {
	return string([]byte{byte('0' + i/100), byte('0' + i/10%10), byte('0' + i%10)})
}

func mustParseFixture(t *testing.T, s string) *sysfstest.Fixture {
	t.Helper()
	f, err := sysfstest.ParseFixture(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}
