package main

import (
	"testing"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/plan"
)

// Every fault the plan can draw on the lab's topology lands on a path or
// volume the soak knows how to break.
func TestTopology_EveryPlannedFaultHasATarget(t *testing.T) {
	vs := volumes()
	known := map[string]bool{}
	for _, v := range vs {
		known[v.id] = true
		if len(v.spec.Paths) != 2 {
			t.Errorf("%s has %d paths, want 2", v.id, len(v.spec.Paths))
		}
	}
	seen := map[plan.Kind]bool{}
	for seed := range uint64(50) {
		for _, f := range plan.Make(seed, 30*time.Minute, topology(vs), plan.DefaultOptions).Faults {
			seen[f.Kind] = true
			if f.Path != "" && pathByID(f.Path).ID != f.Path {
				t.Fatalf("%s: unknown path", f)
			}
			if f.Volume != "" && !known[f.Volume] {
				t.Fatalf("%s: unknown volume", f)
			}
		}
	}
	for _, k := range plan.Kinds {
		if !seen[k] {
			t.Errorf("%s never planned on the lab's topology", k)
		}
	}
}

func TestRemountedReadOnly(t *testing.T) {
	for msg, want := range map[string]string{
		"EXT4-fs (dm-0): Remounting filesystem read-only":       "dm-0",
		"EXT4-fs (nvme1n2): Remounting filesystem read-only":    "nvme1n2",
		"EXT4-fs error (device dm-0): ext4_journal_check_start": "",
		"EXT4-fs (dm-0): mounted filesystem with ordered data":  "",
	} {
		got, ok := remountedReadOnly(msg)
		if ok != (want != "") || got != want && ok {
			t.Errorf("remountedReadOnly(%q) = %q %v, want %q", msg, got, ok, want)
		}
	}
}

func TestHealLine_SeesTeardownsKicksAndRestarts(t *testing.T) {
	for line, want := range map[string]string{
		`{"ts":1,"msg":"Heal verdict","verdict":"repaired","defect":"ControllerNotContributing","controllers":"nvme3 (tcp 127.0.0.3:4423)"}`: "after the teardown of nvme3 (tcp 127.0.0.3:4423) (ControllerNotContributing)",
		`{"ts":1,"msg":"Kicking iSCSI session","session":"session4","kick":"logout-login"}`:                                                  "during the logout-login of session4",
		`{"ts":1,"msg":"Restarting iscsid for stuck sessions","sessions":1}`:                                                                 "during an iscsid restart",
		`{"ts":1,"msg":"Heal verdict","verdict":"deferred"}`:                                                                                 "",
		`not json`: "",
	} {
		got, ok := healLine(line)
		if ok != (want != "") || got != want {
			t.Errorf("healLine(%s) = %q %v, want %q", line, got, ok, want)
		}
	}
}
