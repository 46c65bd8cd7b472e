package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestStore_Version1ReadsAsStaged: a record written before records had a
// state (version 1) is a staged volume, in the state since it was staged.
func TestStore_Version1ReadsAsStaged(t *testing.T) {
	s := newTestStore(t)
	want := testRecord("pvc-old")
	if err := s.Put(want); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.Dir(), "volumes", recordName("pvc-old"))
	var m map[string]any
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["version"] = 1
	delete(m, "state")
	delete(m, "stateSince")
	v1, _ := json.Marshal(m)
	mustWrite(t, path, v1)

	got, err := s.Get("pvc-old")
	if err != nil {
		t.Fatal(err)
	}
	want.Version = 1
	want.State, want.StateSince = StateStaged, want.StagedAt
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("version 1 record (-want +got):\n%s", diff)
	}
	// A version 1 record that carries a state is not one pathmend wrote.
	m["state"] = "attaching"
	bad, _ := json.Marshal(m)
	mustWrite(t, path, bad)
	if _, err := s.Get("pvc-old"); !errors.Is(err, ErrUnreadableRecord) {
		t.Errorf("version 1 with a state: err = %v, want unreadable", err)
	}
}

// TestStore_UnreadableRecordsNameTheirTarget: a record a newer pathmend
// wrote, or one that fails a check, still names its volume and target
// through the envelope every version keeps; a file that is not JSON
// names neither, so it may be any target's.
func TestStore_UnreadableRecordsNameTheirTarget(t *testing.T) {
	s := newTestStore(t)
	dir := filepath.Join(s.Dir(), "volumes")
	nqn := testRecord("x").Context.NVMe.NQN
	future := fmt.Sprintf(`{"version": %d, "volumeID": "pvc-new", "context": {"transport": "nvme-tcp", "nvme": {"nqn": %q}}, "somethingNew": [1, 2]}`, RecordVersion+1, nqn)
	mustWrite(t, filepath.Join(dir, recordName("pvc-new")), []byte(future))
	unknownState := fmt.Sprintf(`{"version": %d, "volumeID": "pvc-odd", "state": "frozen", "context": {"transport": "iscsi", "iscsi": {"iqn": "iqn.2024-01.io.example:t"}}}`, RecordVersion)
	mustWrite(t, filepath.Join(dir, recordName("pvc-odd")), []byte(unknownState))
	mustWrite(t, filepath.Join(dir, recordName("pvc-garbage")), []byte("{\"version\": 2, \"volu"))
	if err := s.Put(testRecord("pvc-ok")); err != nil {
		t.Fatal(err)
	}

	l, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(l.Records); len(got) != 1 || got[0] != "pvc-ok" {
		t.Errorf("readable = %v, want [pvc-ok]", got)
	}
	got := map[string]RecordError{}
	for _, u := range l.Unreadable {
		got[filepath.Base(u.Path)] = RecordError{VolumeID: u.VolumeID, Target: u.Target}
	}
	want := map[string]RecordError{
		recordName("pvc-new"):     {VolumeID: "pvc-new", Target: Target{TransportNVMeTCP, nqn}},
		recordName("pvc-odd"):     {VolumeID: "pvc-odd", Target: Target{TransportISCSI, "iqn.2024-01.io.example:t"}},
		recordName("pvc-garbage"): {},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unreadable records (-want +got):\n%s", diff)
	}

	nv := Target{TransportNVMeTCP, nqn}
	other := Target{TransportNVMeTCP, "nqn.2014-08.io.pathmend.test:other"}
	// The newer record and the undecodable file may be nv's; the iSCSI one
	// is not. The undecodable one may be anyone's.
	if n := len(l.Of(nv).Unreadable); n != 2 {
		t.Errorf("unreadable records of %s: %d, want 2", nv, n)
	}
	if u := l.Of(other).Unreadable; len(u) != 1 || filepath.Base(u[0].Path) != recordName("pvc-garbage") {
		t.Errorf("unreadable records of another target: %v, want only the undecodable one", u)
	}
	co := CoTenants{Unreadable: l.Of(nv).Unreadable}
	if err := co.Err(); !errors.Is(err, ErrTeardownBlocked) || !strings.Contains(err.Error(), recordName("pvc-new")) || !strings.Contains(err.Error(), "written by a newer pathmend") {
		t.Errorf("CoTenants.Err = %v, want a blocked teardown naming the newer record", err)
	}
	if (CoTenants{}).Err() != nil {
		t.Error("CoTenants without unreadable records blocks teardown")
	}
}

// TestStore_PutNeverWritesWhatGetCannotRead: at the read cap's boundary a
// record is written only when it can be read back.
func TestStore_PutNeverWritesWhatGetCannotRead(t *testing.T) {
	s := newTestStore(t)
	r := testRecord("pvc-big")
	r.Version = RecordVersion
	r.MountFlags = []string{"noatime", ""}
	base, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// Fill the record (and Put's newline) to exactly the cap with one long
	// mount flag, then one byte more.
	filler := maxRecordSize - len(base) - 1
	for _, extra := range []int{0, 1} {
		r.MountFlags = []string{"noatime", strings.Repeat("a", filler+extra)}
		err := s.Put(r)
		if extra == 0 {
			if err != nil {
				t.Fatalf("Put of a record of exactly %d bytes: %v", maxRecordSize, err)
			}
			if _, err := s.Get("pvc-big"); err != nil {
				t.Errorf("Get of a record Put accepted: %v", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "the store reads at most") {
			t.Errorf("Put of a record one byte over the cap: err = %v, want refused", err)
		}
	}
}

func TestStore_PutRejectsUnknownState(t *testing.T) {
	s := newTestStore(t)
	for _, st := range []State{"", "frozen"} {
		r := testRecord("pvc-1")
		r.State = st
		if err := s.Put(r); err == nil {
			t.Errorf("Put with state %q succeeded", st)
		}
	}
}
