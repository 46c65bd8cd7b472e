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
