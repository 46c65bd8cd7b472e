package volume

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The store keeps the last parse of each record file under the file's
// identity: the same file is not decoded again, a file changed in any way
// (replaced by a Put, rewritten in place, even to the same size) is, and
// a caller that changes the record it got changes nothing the next caller
// gets.
func TestStore_ReparsesOnlyAChangedFile(t *testing.T) {
	s := newTestStore(t)
	r := testRecord("pv-1")
	r.Publications = []Publication{{TargetPath: "/var/lib/kubelet/pods/a/volumes/x/mount"}}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	first, err := s.Get("pv-1")
	if err != nil {
		t.Fatal(err)
	}
	// Changing what Get returned changes no later Get.
	first.Publications[0].TargetPath = "/elsewhere"
	first.Context.NVMe.Endpoints[0].Host = "203.0.113.9"
	*first.Context.NVMe.CtrlLossTmo = 99
	first.MountFlags[0] = "sync"
	again, err := s.Get("pv-1")
	if err != nil {
		t.Fatal(err)
	}
	r.Version = RecordVersion
	if d := cmp.Diff(r, again); d != "" {
		t.Fatalf("a caller's change of its copy reached the store (-put +get):\n%s", d)
	}
	// Rewritten in place, to the same size: read again.
	path := s.RecordPath("pv-1")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	changed := []byte(string(data))
	for j := range changed {
		if string(changed[j:min(j+len("noatime"), len(changed))]) == "noatime" {
			copy(changed[j:], "relatim")
			break
		}
	}
	if err := os.WriteFile(path, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("pv-1")
	if err != nil || got.MountFlags[0] != "relatim" {
		t.Fatalf("after an in-place rewrite of the same size: %v, %v; want mount flag relatim", got.MountFlags, err)
	}
	// Scan sees the same, and a deleted file is gone.
	l, err := s.Scan()
	if err != nil || len(l.Records) != 1 || l.Records[0].MountFlags[0] != "relatim" {
		t.Fatalf("Scan = %+v, %v", l, err)
	}
	if err := s.Delete("pv-1"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.Scan(); err != nil || len(l.Records) != 0 {
		t.Fatalf("Scan after the delete = %+v, %v", l, err)
	}
}
