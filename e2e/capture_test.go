//go:build e2e

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

func TestCapture_LiveTreeRoundTripsThroughTheFixtureFormat(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-capture"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	c1, c2 := connectTwoPorts(t, fsys, nqn)
	sub := subsystemOf(t, fsys, c1)
	head := "nvme" + strings.TrimPrefix(sub, "nvme-subsys") + "n1"
	eventually(t, time.Minute, "head "+head, func() bool {
		_, err := fsys.Stat("block/" + head)
		return err == nil
	})

	dir := t.TempDir()
	live := filepath.Join(dir, "live.sysfs")
	run(t, l.bin("capture-sysfs"), "-o", live, "-comment", "scenario: e2e round trip")
	f, err := sysfstest.LoadFixture(live)
	if err != nil {
		t.Fatal(err)
	}

	// What pathmend reads is there, write-only attributes included.
	ctrlDir := "devices/virtual/nvme-fabrics/ctl/" + c1
	want := map[string]sysfstest.EntryKind{
		"class/nvme/" + c1:                      sysfstest.KindLink,
		ctrlDir:                                 sysfstest.KindDir,
		ctrlDir + "/state":                      sysfstest.KindFile,
		ctrlDir + "/delete_controller":          sysfstest.KindWriteOnly,
		"block/" + head:                         sysfstest.KindLink,
		"module/nvme_core/parameters/multipath": sysfstest.KindFile,
	}
	for p, k := range want {
		e, ok := f.Lookup(p)
		if !ok || e.Kind != k {
			t.Errorf("capture: %s = %+v (present %t), want a %s entry", p, e, ok, k)
		}
	}
	// The host identity is sanitized everywhere.
	hostnqn, _ := os.ReadFile("/etc/nvme/hostnqn")
	raw, _ := os.ReadFile(live)
	if bytes.Contains(raw, bytes.TrimSpace(hostnqn)) {
		t.Errorf("capture still holds the host NQN %s", bytes.TrimSpace(hostnqn))
	}

	// Materialize it and capture the materialized tree again: every entry
	// comes back the same, directory ages grown only by the time between.
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := f.Materialize(tree, t0); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "again.sysfs")
	run(t, l.bin("capture-sysfs"), "-root", tree, "-no-sanitize", "-o", again)
	g, err := sysfstest.LoadFixture(again)
	if err != nil {
		t.Fatal(err)
	}
	slack := time.Since(t0) + time.Second
	if len(g.Entries) != len(f.Entries) {
		t.Errorf("recapture has %d entries, capture %d", len(g.Entries), len(f.Entries))
	}
	for _, e := range f.Entries {
		r, ok := g.Lookup(e.Path)
		if !ok {
			t.Errorf("recapture lost %s %s", e.Kind, e.Path)
			continue
		}
		if e.Kind == sysfstest.KindDir {
			if r.Kind != e.Kind || r.Age < e.Age-time.Millisecond || r.Age > e.Age+slack {
				t.Errorf("dir %s: recaptured %+v, captured age %s", e.Path, r, e.Age)
			}
			continue
		}
		if r != e {
			t.Errorf("recapture of %s = %+v, want %+v", e.Path, r, e)
		}
	}

	// The summary of the fixture shows the topology.
	out := run(t, l.bin("capture-sysfs"), "-summary", "-fixture", live)
	for _, w := range []string{nqn, c1, c2, "optimized", "non-optimized", "live"} {
		if !strings.Contains(out, w) {
			t.Errorf("summary lacks %q:\n%s", w, out)
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}
