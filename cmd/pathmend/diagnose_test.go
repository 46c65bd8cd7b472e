package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// diagnoseNow is both the time fixtures are materialized at and the clock
// of diagnose, so ages in the report are the ages the capture saw.
var diagnoseNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const fixtureDir = "../../testdata/fixtures"

// sysRoot materializes a captured fixture and returns its root.
func sysRoot(t *testing.T, fixture string) string {
	t.Helper()
	dir := t.TempDir()
	if err := sysfstest.Materialize(filepath.Join(fixtureDir, fixture+".sysfs"), dir, diagnoseNow); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stateDir writes the staged-volume records of a fixture (the volumes of
// pkg/nvme/testdata/staged-volumes.json) into a fresh store.
func stateDir(t *testing.T, fixture string) string {
	t.Helper()
	b, err := os.ReadFile("../../pkg/nvme/testdata/staged-volumes.json")
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
	dir := t.TempDir()
	store, err := volume.NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range all[fixture] {
		c, _, err := volume.Parse(v.Context, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := volume.Record{VolumeID: v.VolumeID, State: volume.StateStaged, Context: c, AccessType: volume.AccessBlock, StagingPath: "/staging/" + v.VolumeID, Device: "/dev/nvme0n1", StagedAt: diagnoseNow}
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runDiagnoseAt(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = diagnose(args, &out, &errb, func() time.Time { return diagnoseNow })
	return code, out.String(), errb.String()
}

func TestDiagnose_Fixtures(t *testing.T) {
	for fixture, wantCode := range map[string]int{
		"nvme-healthy":                     0,
		"nvme-path-reconnecting":           0,
		"nvme-no-namespace":                1,
		"nvme-namespace-missing":           1,
		"nvme-controller-not-contributing": 1,
	} {
		t.Run(fixture, func(t *testing.T) {
			root, state := sysRoot(t, fixture), stateDir(t, fixture)
			for _, format := range []string{"txt", "json"} {
				args := []string{"--sys-root", root, "--state-dir", state}
				if format == "json" {
					args = append(args, "--json")
				}
				code, out, errOut := runDiagnoseAt(args...)
				if code != wantCode || errOut != "" {
					t.Errorf("%s: exit %d, want %d; stderr %q", format, code, wantCode, errOut)
				}
				out = strings.NewReplacer(root, "$SYSROOT", state, "$STATEDIR").Replace(out)
				checkGolden(t, filepath.Join("testdata", "diagnose", fixture+"."+format), out)
			}
		})
	}
}

func TestDiagnose_JSONSchema(t *testing.T) {
	code, out, _ := runDiagnoseAt("--sys-root", sysRoot(t, "nvme-namespace-missing"), "--state-dir", stateDir(t, "nvme-namespace-missing"), "--json")
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["schemaVersion"] != float64(diagnoseSchemaVersion) || doc["healthy"] != false {
		t.Errorf("schemaVersion %v, healthy %v", doc["schemaVersion"], doc["healthy"])
	}
	// Every documented top-level key is present and no other.
	var keys []string
	for k := range doc {
		keys = append(keys, k)
	}
	want := []string{"defects", "healthy", "iscsi", "schemaVersion", "skipped", "stateDir", "subsystems", "sysRoot", "time", "unlistedControllers", "volumes"}
	if d := cmp.Diff(want, slices.Sorted(slices.Values(keys))); d != "" {
		t.Errorf("top-level keys (-want +got):\n%s", d)
	}
	doc2, _ := os.ReadFile("../../docs/diagnose.md")
	for _, k := range want {
		if !strings.Contains(string(doc2), "`"+k+"`") {
			t.Errorf("docs/diagnose.md does not document %q", k)
		}
	}
}

func TestDiagnose_BareNodeAndReadOnlyStateDir(t *testing.T) {
	root := sysRoot(t, "nvme-no-namespace")
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	empty := t.TempDir()
	for _, state := range []string{missing, empty, ""} {
		code, out, errOut := runDiagnoseAt("--sys-root", root, "--state-dir", state)
		if code != 1 || !strings.Contains(out, "NoNamespace") || errOut != "" {
			t.Errorf("state dir %q: exit %d, stderr %q, report:\n%s", state, code, errOut, out)
		}
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("diagnose created the missing state dir: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("diagnose wrote into the state dir: %v", entries)
	}
}

func TestDiagnose_Errors(t *testing.T) {
	// A tree whose controller lost a required attribute.
	f, err := sysfstest.LoadFixture(filepath.Join(fixtureDir, "nvme-healthy.sysfs"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []sysfstest.Entry
	for _, e := range f.Entries {
		if e.Path != "devices/virtual/nvme-fabrics/ctl/nvme1/state" {
			kept = append(kept, e)
		}
	}
	f.Entries = kept
	broken := t.TempDir()
	if err := f.Materialize(broken, diagnoseNow); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--sys-root", broken}, "read class/nvme/nvme1/state"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--sys-root", broken, "extra"}, "unexpected arguments"},
	} {
		code, out, errOut := runDiagnoseAt(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.stderr) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errOut, tc.stderr)
		}
	}
	if code, _, _ := runDiagnoseAt("-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

// TestDiagnose_UnreadableRecords: a record that cannot be read does not
// stop the diagnosis; it is listed with the target it may belong to (or
// as blocking every target), in the table and the JSON, and the node is
// not healthy. The other records still count.
func TestDiagnose_UnreadableRecords(t *testing.T) {
	state := stateDir(t, "nvme-healthy")
	corrupt := filepath.Join(state, "volumes", "vol-0123456789abcdef0123456789abcdef.json")
	if err := os.WriteFile(corrupt, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(state, "volumes", "vol-fedcba9876543210fedcba9876543210.json")
	if err := os.WriteFile(newer, []byte(`{"version": 99, "volumeID": "pv-new", "context": {"transport": "nvme-tcp", "nvme": {"nqn": "nqn.2024-01.io.pathmend.lab:healthy-b"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--sys-root", sysRoot(t, "nvme-healthy"), "--state-dir", state}
	code, out, errOut := runDiagnoseAt(args...)
	if code != 1 || errOut != "" {
		t.Fatalf("exit %d, stderr %q; want 1", code, errOut)
	}
	for _, want := range []string{
		"2 staged-volume record(s) cannot be read",
		corrupt, "unknown: blocks every target", "corrupt: unexpected end of JSON input",
		newer, "pv-new", "nvme-tcp nqn.2024-01.io.pathmend.lab:healthy-b", "written by a newer pathmend (version 99)",
		"pv-a1", // the readable records still count
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runDiagnoseAt(append(args, "--json")...)
	var rep struct {
		Healthy    bool
		Unreadable []unreadableRep `json:"unreadableRecords"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || rep.Healthy || len(rep.Unreadable) != 2 {
		t.Fatalf("json: exit %d, %+v, %v", code, rep, err)
	}
}

func TestRun_Diagnose(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"diagnose", "--sys-root", sysRoot(t, "nvme-healthy"), "--state-dir", ""}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "No defects.") {
		t.Errorf("run diagnose: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// checkGolden compares got with the golden file at path; -update rewrites
// the file instead.
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if d := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); d != "" {
		t.Errorf("%s differs (-want +got):\n%s", path, d)
	}
}

// TestDiagnose_Plan shows the policy's dry-run verdicts on the captures
// with defects: the captures are seconds old at diagnoseNow, so the
// connect grace defers some, and the co-tenant gate refuses the teardown
// that would strand namespaces 1 and 3.
func TestDiagnose_Plan(t *testing.T) {
	for _, fixture := range []string{"nvme-no-namespace", "nvme-namespace-missing", "nvme-controller-not-contributing"} {
		t.Run(fixture, func(t *testing.T) {
			root, state := sysRoot(t, fixture), stateDir(t, fixture)
			for _, grace := range []string{"5s", "1ms"} {
				for _, format := range []string{"txt", "json"} {
					args := []string{"--sys-root", root, "--state-dir", state, "--plan", "--heal-grace", grace}
					if format == "json" {
						args = append(args, "--json")
					}
					code, out, errOut := runDiagnoseAt(args...)
					if code != 1 || errOut != "" {
						t.Errorf("exit %d, stderr %q", code, errOut)
					}
					if !strings.Contains(out, "lan") {
						t.Errorf("no plan in the output:\n%s", out)
					}
					out = strings.NewReplacer(root, "$SYSROOT", state, "$STATEDIR").Replace(out)
					checkGolden(t, filepath.Join("testdata", "diagnose", fixture+".plan-grace-"+grace+"."+format), out)
				}
			}
		})
	}
}
