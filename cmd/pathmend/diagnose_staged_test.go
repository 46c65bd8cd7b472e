package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// A staged filesystem mounted from a device the kernel removed (the
// namespace is now another head) is a StagedDeviceReplaced defect; one
// mounted from its namespace's head is not, whatever the mount's source
// name says. Compared by device number: the capture's nvme0n2 is 259:3.
func TestDiagnose_StagedDeviceReplaced(t *testing.T) {
	root, state := sysRoot(t, "nvme-healthy"), stateDir(t, "nvme-healthy")
	stageExt4(t, state)
	mi := filepath.Join(t.TempDir(), "mountinfo")
	table := "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" +
		"36 22 259:1 / /staging/pv-a1 rw,relatime shared:2 - ext4 /dev/disk/by-id/nvme-uuid.f68ad72e rw\n" + // the head, by another name
		"37 22 259:9 / /staging/pv-a2 rw,relatime shared:3 - ext4 /dev/nvme0n7 rw\n"
	if err := os.WriteFile(mi, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runDiagnoseAt("--sys-root", root, "--state-dir", state, "--mountinfo", mi, "--json", "--plan")
	if code != diagnoseDefects || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	type defect struct {
		Kind, Scope, Key, Subject, Detail string
		Teardown                          []heal.Path
		Volumes                           []string
	}
	var rep struct {
		Defects []defect `json:"defects"`
		Plan    []struct {
			Verdict heal.Verdict
			Reason  string
		} `json:"plan"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Defects) != 1 {
		t.Fatalf("defects = %+v", rep.Defects)
	}
	d := rep.Defects[0]
	want := defect{Kind: "StagedDeviceReplaced", Scope: "controller", Key: "pv-a2",
		Subject: "volume pv-a2 on nvme0n7 (259:9), not one of nvme0n2 (259:3)", Teardown: []heal.Path{}, Volumes: []string{"pv-a2"}, Detail: d.Detail}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("defect (-want +got):\n%s", diff)
	}
	for _, s := range []string{"the staging mount at /staging/pv-a2", "restart the pods"} {
		if !strings.Contains(d.Detail, s) {
			t.Errorf("detail %q lacks %q", d.Detail, s)
		}
	}
	if len(rep.Plan) != 1 || rep.Plan[0].Verdict != heal.Refused || !strings.HasPrefix(rep.Plan[0].Reason, "no automatic repair: restart the pods") {
		t.Errorf("plan = %+v", rep.Plan)
	}
	// Without the mount table, nothing is compared.
	if code, _, _ := runDiagnoseAt("--sys-root", root, "--state-dir", state, "--mountinfo", ""); code != diagnoseHealthy {
		t.Errorf("--mountinfo '': exit %d", code)
	}
}

// A staged ext4 whose sysfs error record counts errors, with
// errors=remount-ro in force, is a FilesystemReadOnly defect naming the
// device and the errors (the attribute values are the lab kernel's after
// an outage); the plan refuses any automatic repair. The healthy
// co-tenant on the same head's subsystem is no defect.
func TestDiagnose_FilesystemReadOnly(t *testing.T) {
	root, state := sysRoot(t, "nvme-healthy"), stateDir(t, "nvme-healthy")
	stageExt4(t, state)
	// The capture's heads: nvme0n1 is 259:1, nvme0n2 259:3.
	for dev, attrs := range map[string]map[string]string{
		"nvme0n1": {"errors_count": "7", "first_error_time": "1796405719", "first_error_func": "ext4_wait_block_bitmap", "last_error_time": "1796405739", "last_error_func": "__ext4_new_inode"},
		"nvme0n2": {"errors_count": "0", "first_error_time": "0", "last_error_time": "0"},
	} {
		d := filepath.Join(root, "fs/ext4", dev)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, v := range attrs {
			if err := os.WriteFile(filepath.Join(d, k), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "dev/block"), 0o755); err != nil {
		t.Fatal(err)
	}
	for num, dev := range map[string]string{"259:1": "nvme0n1", "259:3": "nvme0n2"} {
		if err := os.Symlink("../../devices/virtual/nvme-subsystem/nvme-subsys0/"+dev, filepath.Join(root, "dev/block", num)); err != nil {
			t.Fatal(err)
		}
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "fs/ext4/nvme0n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "fs/ext4/nvme0n1/options"), []byte("rw\ndelalloc\nerrors=remount-ro\ndata=ordered\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	table := "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" +
		"36 22 259:1 / /staging/pv-a1 rw,relatime shared:2 - ext4 /dev/nvme0n1 rw,errors=remount-ro\n" +
		"37 22 259:3 / /staging/pv-a2 rw,relatime shared:3 - ext4 /dev/nvme0n2 rw,errors=remount-ro\n"
	if err := os.WriteFile(mi, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runDiagnoseAt("--sys-root", root, "--state-dir", state, "--mountinfo", mi, "--proc-root", proc, "--json", "--plan")
	if code != diagnoseDefects || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep struct {
		Defects []struct{ Kind, Key, Subject, Detail string } `json:"defects"`
		Plan    []struct {
			Kind    string
			Verdict heal.Verdict
			Reason  string
		} `json:"plan"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Defects) != 1 {
		t.Fatalf("defects = %+v", rep.Defects)
	}
	d := rep.Defects[0]
	if d.Kind != "FilesystemReadOnly" || d.Key != "pv-a1" || d.Subject != "volume pv-a1: ext4 on nvme0n1 (259:1): read-only after 7 errors since 2026-12-04T17:35:19Z (errors=remount-ro)" {
		t.Errorf("defect = %+v", d)
	}
	if !strings.Contains(d.Detail, "restart the volume's pods") {
		t.Errorf("detail %q says nothing of what to do", d.Detail)
	}
	var planned bool
	for _, p := range rep.Plan {
		if p.Kind == "FilesystemReadOnly" {
			planned = p.Verdict == heal.Refused && strings.HasPrefix(p.Reason, "no automatic repair")
		}
	}
	if !planned {
		t.Errorf("plan = %+v", rep.Plan)
	}
	code, out, _ = runDiagnoseAt("--sys-root", root, "--state-dir", state, "--mountinfo", mi, "--proc-root", proc)
	if code != diagnoseDefects || !strings.Contains(out, "FilesystemReadOnly") {
		t.Errorf("table: exit %d:\n%s", code, out)
	}
}

// stageExt4 makes the capture's records of pv-a1 and pv-a2 ext4
// filesystem volumes staged at /staging/<id>.
func stageExt4(t *testing.T, state string) {
	t.Helper()
	store, err := volume.NewStore(state)
	if err != nil {
		t.Fatal(err)
	}
	for id, staging := range map[string]string{"pv-a1": "/staging/pv-a1", "pv-a2": "/staging/pv-a2"} {
		r, err := store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		r.AccessType, r.FSType, r.StagingPath = volume.AccessMount, "ext4", staging
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
}
