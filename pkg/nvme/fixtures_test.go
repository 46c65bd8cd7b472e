package nvme

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// fixtureDir holds the sysfs trees captured from Linux 6.1 in the lab.
const fixtureDir = "../../testdata/fixtures"

// fixtureKinds is what each NVMe capture must yield, bare (no staged
// volume) and with the volumes of testdata/staged-volumes.json.
var fixtureKinds = map[string]struct{ bare, staged []heal.Kind }{
	"nvme-healthy":                     {},
	"nvme-path-reconnecting":           {},
	"nvme-no-namespace":                {bare: []heal.Kind{heal.NoNamespace}, staged: []heal.Kind{heal.NoNamespace}},
	"nvme-namespace-missing":           {staged: []heal.Kind{heal.NamespaceMissing}},
	"nvme-controller-not-contributing": {bare: []heal.Kind{heal.ControllerNotContributing}, staged: []heal.Kind{heal.ControllerNotContributing}},
}

// stagedVolumes reads the staged-volume contexts of a fixture, parsed the
// way NodeStage parses them.
func stagedVolumes(t *testing.T, fixture string) []volume.Record {
	t.Helper()
	b, err := os.ReadFile("testdata/staged-volumes.json")
	if err != nil {
		t.Fatal(err)
	}
	var all map[string][]struct {
		VolumeID string            `json:"volumeID"`
		Context  map[string]string `json:"context"`
	}
	if err := json.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	var out []volume.Record
	for _, v := range all[fixture] {
		c, _, err := volume.Parse(v.Context, nil)
		if err != nil {
			t.Fatalf("%s: volume %s: %v", fixture, v.VolumeID, err)
		}
		out = append(out, volume.Record{VolumeID: v.VolumeID, Context: c, AccessType: volume.AccessBlock})
	}
	return out
}

// fixtureGolden is the golden record of one capture.
type fixtureGolden struct {
	Host   *Host         `json:"host"`
	Bare   []heal.Defect `json:"bare"`
	Staged []heal.Defect `json:"staged"`
}

func TestFixtures_EveryNVMeCaptureIsCovered(t *testing.T) {
	names, err := filepath.Glob(filepath.Join(fixtureDir, "nvme-*.sysfs"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no NVMe fixtures in %s (%v)", fixtureDir, err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(filepath.Base(n), ".sysfs")
		if _, ok := fixtureKinds[name]; !ok {
			t.Errorf("fixture %s has no expectation in fixtureKinds", name)
		}
	}
}

// The most important test of pathmend: a healthy capture from a real
// kernel yields no defect, bare or with its volumes staged.
func TestFixtures_HealthyCapturesYieldNoDefect(t *testing.T) {
	names, _ := filepath.Glob(filepath.Join(fixtureDir, "nvme-healthy*.sysfs"))
	if len(names) == 0 {
		t.Fatal("no healthy NVMe capture")
	}
	for _, n := range names {
		h := mustRead(t, materializeFile(t, n))
		fixture := strings.TrimSuffix(filepath.Base(n), ".sysfs")
		if len(h.Controllers) == 0 || len(h.Skipped) != 0 {
			t.Fatalf("%s: %d controllers, skipped %+v", fixture, len(h.Controllers), h.Skipped)
		}
		for _, want := range [][]Expectation{nil, expectations(t, fixture)} {
			if got := Inspect(h, want); len(got) != 0 {
				t.Errorf("%s with %d volumes: Inspect = %+v", fixture, len(want), got)
			}
		}
	}
}

func TestFixtures_Golden(t *testing.T) {
	for fixture, kinds := range fixtureKinds {
		t.Run(fixture, func(t *testing.T) {
			h := mustRead(t, materializeFile(t, filepath.Join(fixtureDir, fixture+".sysfs")))
			got := fixtureGolden{Host: h, Bare: Inspect(h, nil), Staged: Inspect(h, expectations(t, fixture))}
			if d := cmp.Diff(kinds.bare, kindsOf(got.Bare)); d != "" {
				t.Errorf("bare defect kinds (-want +got):\n%s", d)
			}
			if d := cmp.Diff(kinds.staged, kindsOf(got.Staged)); d != "" {
				t.Errorf("staged defect kinds (-want +got):\n%s", d)
			}
			checkGolden(t, filepath.Join("testdata", fixture+".golden.json"), got)
		})
	}
}

func materializeFile(t *testing.T, path string) sysfs.FS {
	t.Helper()
	dir := t.TempDir()
	if err := sysfstest.Materialize(path, dir, testNow); err != nil {
		t.Fatal(err)
	}
	return sysfs.New(dir)
}

func expectations(t *testing.T, fixture string) []Expectation {
	var want []Expectation
	for _, r := range stagedVolumes(t, fixture) {
		if e, ok := ExpectationFromRecord(r); ok {
			want = append(want, e)
		}
	}
	return want
}

func kindsOf(ds []heal.Defect) []heal.Kind {
	var ks []heal.Kind
	for _, d := range ds {
		ks = append(ks, d.Kind)
	}
	return ks
}

// checkGolden compares v, encoded as indented JSON, with the golden file
// at path; -update rewrites the file instead.
func checkGolden(t *testing.T, path string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(want, got) {
		t.Errorf("%s differs (-want +got):\n%s", path, cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")))
	}
}
