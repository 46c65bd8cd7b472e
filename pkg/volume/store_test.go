package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func newTestStore(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return s
}

// testRecord is a valid record of volumeID as the driver writes it.
func testRecord(volumeID string) Record {
	return Record{
		VolumeID:    volumeID,
		State:       StateStaged,
		StateSince:  time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC),
		Context:     nvmeWant(func(n *NVMeTCP) { n.CtrlLossTmo = intp(-1) }),
		StagingPath: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.pathmend.io/abc/globalmount",
		AccessType:  AccessMount,
		FSType:      "ext4",
		MountFlags:  []string{"noatime"},
		Device:      "/dev/nvme0n1",
		StagedAt:    time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC),
	}
}

func TestNewStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s, err := NewStore(dir + "/")
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	if s.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", s.Dir(), dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, "volumes")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want a 0700 directory", d, fi.Mode())
		}
	}
	// A second store over the same directory is fine and changes nothing.
	if _, err := NewStore(dir); err != nil {
		t.Errorf("NewStore on an existing directory: %v", err)
	}
}

func TestNewStore_Rejects(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", "relative/state", file} {
		if _, err := NewStore(dir); err == nil {
			t.Errorf("NewStore(%q) succeeded, want an error", dir)
		}
	}
}

func TestStore_RoundTrip(t *testing.T) {
	s := newTestStore(t)
	in := testRecord("pvc-1")
	in.ReadOnly = true
	in.Publications = []Publication{{TargetPath: "/var/lib/kubelet/pods/p1/volumes/x/mount"}, {TargetPath: "/t2", ReadOnly: true}}
	if err := s.Put(in); err != nil {
		t.Fatalf("Put: %v", err)
	}
	got, err := s.Get("pvc-1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	want := in
	want.Version = RecordVersion // set by Put
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Get (-want +got):\n%s", diff)
	}
	if !got.Context.Equal(in.Context) {
		t.Error("Context.Equal = false after a round trip through disk")
	}

	path := filepath.Join(s.Dir(), "volumes", recordName("pvc-1"))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("record file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode %v, want 0600", fi.Mode().Perm())
	}
	if !isRecordName(filepath.Base(path)) {
		t.Errorf("record name %s does not match the record pattern", filepath.Base(path))
	}
}

func TestStore_PutReplaces(t *testing.T) {
	s := newTestStore(t)
	r := testRecord("pvc-1")
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	r.Publications = []Publication{{TargetPath: "/target"}}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r.Publications, got.Publications); diff != "" {
		t.Errorf("Publications (-want +got):\n%s", diff)
	}
	entries, err := os.ReadDir(filepath.Join(s.Dir(), "volumes"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("records directory holds %d entries after two Puts, want 1 (no leftover temp files)", len(entries))
	}
}

func TestStore_PutRejects(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(r *Record)
		reason string
	}{
		{"empty volume ID", func(r *Record) { r.VolumeID = "" }, "empty volume ID"},
		{"volume ID not UTF-8", func(r *Record) { r.VolumeID = "vol-\xff" }, "not valid UTF-8"},
		{"unknown access type", func(r *Record) { r.AccessType = "raw" }, `unknown access type "raw"`},
		{"missing access type", func(r *Record) { r.AccessType = "" }, "unknown access type"},
		{"block with fsType", func(r *Record) { r.AccessType = AccessBlock; r.MountFlags = nil }, "apply only to access type"},
		{"block with mount flags", func(r *Record) { r.AccessType = AccessBlock; r.FSType = "" }, "apply only to access type"},
		{"publication without target", func(r *Record) { r.Publications = []Publication{{}} }, "has no target path"},
		{"publication twice", func(r *Record) {
			r.Publications = []Publication{{TargetPath: "/t"}, {TargetPath: "/t", ReadOnly: true}}
		}, "published twice"},
		{"more publications than MaxPublications", func(r *Record) { r.Publications = publications(MaxPublications+1, "/t") }, "at most 256"},
		{"staging path not UTF-8", func(r *Record) { r.StagingPath = "/s-\xff" }, "not valid UTF-8"},
		{"target path not UTF-8", func(r *Record) { r.Publications = []Publication{{TargetPath: "/t-\xfe"}} }, "not valid UTF-8"},
		{"mount flag not UTF-8", func(r *Record) { r.MountFlags = []string{"\xfe"} }, "not valid UTF-8"},
		{"larger than Get reads", func(r *Record) {
			r.Publications = publications(MaxPublications, "/"+strings.Repeat("\u2028", maxRecordSize/MaxPublications/3))
		}, "the store reads at most"},
		{"zero context", func(r *Record) { r.Context = Context{} }, `context: volume context key "transport"`},
		{"context with the wrong sub-struct", func(r *Record) { r.Context.Transport = TransportISCSI }, "context:"},
		{"context Parse would reject", func(r *Record) { r.Context.NVMe.NSID = 0 }, `volume context key "nsid"`},
		{"context not normalized", func(r *Record) { r.Context.NVMe.Endpoints[0].Host = "::FFFF:192.0.2.10" }, "not in the normalized form"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t)
			r := testRecord("pvc-1")
			tc.mod(&r)
			err := s.Put(r)
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Put error = %v, want one containing %q", err, tc.reason)
			}
			recs, lerr := s.List()
			if lerr != nil || len(recs) != 0 {
				t.Errorf("after a rejected Put, List = %d records, %v; want none", len(recs), lerr)
			}
		})
	}
}

// publications returns n publications at distinct target paths starting
// with prefix.
func publications(n int, prefix string) []Publication {
	out := make([]Publication, n)
	for i := range out {
		out[i] = Publication{TargetPath: fmt.Sprintf("%s/%d", prefix, i), ReadOnly: i%2 == 0}
	}
	return out
}

// A record whose paths are all characters JSON escapes, or that HTML
// escaping would spell in six bytes, reads back as it was put.
func TestStore_EscapedCharactersRoundTrip(t *testing.T) {
	s := newTestStore(t)
	r := testRecord("pvc-<&>\"\\\u2028")
	r.StagingPath = "/var/lib/kubelet/<&>\"\\\u2028\u2029/globalmount"
	r.Publications = []Publication{{TargetPath: "/var/lib/kubelet/pods/<a&b>/mount"}}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(r.VolumeID)
	if err != nil {
		t.Fatal(err)
	}
	r.Version = RecordVersion
	if diff := cmp.Diff(r, got); diff != "" {
		t.Errorf("record (-put +got):\n%s", diff)
	}
	data, err := os.ReadFile(filepath.Join(s.records, recordName(r.VolumeID)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `\u003c`) {
		t.Errorf("record escapes '<' as \\u003c:\n%s", data)
	}
}

func TestStore_GetMissing(t *testing.T) {
	s := newTestStore(t)
	_, err := s.Get("pvc-missing")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get error = %v, want ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "pvc-missing") {
		t.Errorf("error %q does not name the volume", err)
	}
}

func TestStore_DeleteIsIdempotent(t *testing.T) {
	s := newTestStore(t)
	if err := s.Put(testRecord("pvc-1")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.Delete("pvc-1"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := s.Get("pvc-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrNotFound", err)
	}
	if err := s.Delete("never-staged"); err != nil {
		t.Errorf("Delete of an unknown volume: %v", err)
	}
}

// TestStore_CrashLeftovers builds the directory a crash can leave behind:
// the temp file of an interrupted Put next to the intact old record, a
// truncated record (a file system without ordered data after power loss),
// an empty one and an empty JSON object. Good records stay readable and each bad one is
// reported by name, never as "not found".
func TestStore_CrashLeftovers(t *testing.T) {
	s := newTestStore(t)
	dir := filepath.Join(s.Dir(), "volumes")
	for _, id := range []string{"pvc-b", "pvc-a", "pvc-truncated", "pvc-empty", "pvc-object"} {
		if err := s.Put(testRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	full, err := os.ReadFile(filepath.Join(dir, recordName("pvc-truncated")))
	if err != nil {
		t.Fatal(err)
	}
	// An interrupted Put of pvc-a: half of its new version in a temp file.
	tmp := filepath.Join(dir, tmpPrefix+recordName("pvc-a")+"-123456")
	mustWrite(t, tmp, full[:len(full)/2])
	mustWrite(t, filepath.Join(dir, recordName("pvc-truncated")), full[:len(full)/2])
	mustWrite(t, filepath.Join(dir, recordName("pvc-empty")), nil)
	mustWrite(t, filepath.Join(dir, recordName("pvc-object")), []byte("{}"))
	// Foreign files are ignored, too.
	mustWrite(t, filepath.Join(dir, "README"), []byte("not a record"))

	recs, err := s.List()
	if got := ids(recs); !slices.Equal(got, []string{"pvc-a", "pvc-b"}) {
		t.Errorf("List records = %v, want [pvc-a pvc-b]", got)
	}
	if err == nil {
		t.Fatal("List error = nil, want the corrupt records reported")
	}
	for _, id := range []string{"pvc-truncated", "pvc-empty", "pvc-object"} {
		if !strings.Contains(err.Error(), recordName(id)) {
			t.Errorf("List error does not name the corrupt record of %s: %v", id, err)
		}
	}
	if strings.Contains(err.Error(), filepath.Base(tmp)) {
		t.Errorf("List reports the temp file: %v", err)
	}

	for _, id := range []string{"pvc-truncated", "pvc-empty", "pvc-object"} {
		_, err := s.Get(id)
		if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), recordName(id)) {
			t.Errorf("Get(%s) error = %v, want a corruption error naming the file", id, err)
		}
	}
	if r, err := s.Get("pvc-a"); err != nil || r.VolumeID != "pvc-a" {
		t.Errorf("Get(pvc-a) = %v, %v; the interrupted Put must leave the old record", r.VolumeID, err)
	}

	// A new Put of a corrupt record repairs it.
	if err := s.Put(testRecord("pvc-truncated")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("pvc-truncated"); err != nil {
		t.Errorf("Get after rewriting a corrupt record: %v", err)
	}
}

func TestStore_ForeignAndFutureRecords(t *testing.T) {
	s := newTestStore(t)
	dir := filepath.Join(s.Dir(), "volumes")
	if err := s.Put(testRecord("pvc-1")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, recordName("pvc-1")))
	if err != nil {
		t.Fatal(err)
	}
	// pvc-1's record copied under pvc-2's name.
	mustWrite(t, filepath.Join(dir, recordName("pvc-2")), data)
	// A record of a later format version.
	var r map[string]any
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r["version"], r["volumeID"] = RecordVersion+1, "pvc-3"
	future, _ := json.Marshal(r)
	mustWrite(t, filepath.Join(dir, recordName("pvc-3")), future)

	if _, err := s.Get("pvc-2"); err == nil || !strings.Contains(err.Error(), `holds volume "pvc-1", not "pvc-2"`) {
		t.Errorf("Get(pvc-2) error = %v, want an ID mismatch", err)
	}
	newer := fmt.Sprintf("written by a newer pathmend (version %d)", RecordVersion+1)
	if _, err := s.Get("pvc-3"); err == nil || !strings.Contains(err.Error(), newer) || errors.Is(err, ErrNotFound) || !errors.Is(err, ErrUnreadableRecord) {
		t.Errorf("Get(pvc-3) error = %v, want %q, never not found", err, newer)
	}
	recs, err := s.List()
	if got := ids(recs); !slices.Equal(got, []string{"pvc-1"}) {
		t.Errorf("List records = %v, want [pvc-1]", got)
	}
	if err == nil || !strings.Contains(err.Error(), "whose record is") || !strings.Contains(err.Error(), newer) {
		t.Errorf("List error = %v, want the copied and the future record reported", err)
	}
}

// TestStore_WeirdVolumeIDs stores IDs that are unsafe as file names; each
// must stay inside the records directory and come back unchanged.
func TestStore_WeirdVolumeIDs(t *testing.T) {
	s := newTestStore(t)
	weird := []string{
		"a/b",
		"..",
		"../../etc/passwd",
		"/absolute",
		"ボリューム-1",
		"with space and \"quotes\"",
		"nul\x00inside",
		strings.Repeat("x", 128),
		strings.Repeat("é", 64), // 128 bytes of UTF-8
	}
	for _, id := range weird {
		if err := s.Put(testRecord(id)); err != nil {
			t.Fatalf("Put(%q): %v", id, err)
		}
		got, err := s.Get(id)
		if err != nil {
			t.Fatalf("Get(%q): %v", id, err)
		}
		if got.VolumeID != id {
			t.Errorf("Get(%q).VolumeID = %q", id, got.VolumeID)
		}
	}
	recs, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(recs) != len(weird) {
		t.Errorf("List returned %d records, want %d", len(recs), len(weird))
	}
	// Nothing was written outside the records directory.
	err = filepath.WalkDir(s.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && filepath.Dir(p) != filepath.Join(s.Dir(), "volumes") {
			t.Errorf("file outside the records directory: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range weird {
		if err := s.Delete(id); err != nil {
			t.Errorf("Delete(%q): %v", id, err)
		}
	}
}

func TestStore_ListSorted(t *testing.T) {
	s := newTestStore(t)
	for _, id := range []string{"pvc-c", "pvc-a", "pvc-b"} {
		if err := s.Put(testRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(recs); !slices.Equal(got, []string{"pvc-a", "pvc-b", "pvc-c"}) {
		t.Errorf("List = %v, want sorted [pvc-a pvc-b pvc-c]", got)
	}
}

// TestStore_ConcurrentPut is meant for -race: Puts of different volumes
// share only the directory.
func TestStore_ConcurrentPut(t *testing.T) {
	s := newTestStore(t)
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("pvc-%02d", i)
			if err := s.Put(testRecord(id)); err != nil {
				errs <- err
				return
			}
			if _, err := s.Get(id); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	recs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Errorf("List returned %d records, want %d", len(recs), n)
	}
}

func TestStore_Writable(t *testing.T) {
	s := newTestStore(t)
	dir := filepath.Join(s.Dir(), "volumes")
	before, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Writable(); err != nil {
			t.Fatalf("Writable: %v", err)
		}
	}
	// A file created and removed would change the directory's mtime.
	after, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("Writable changed the records directory (mtime %v → %v): it must create no file", before.ModTime(), after.ModTime())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("Writable left %d files behind", len(entries))
	}
	// Root ignores permission bits, so break the store by removing its
	// directory instead of chmod.
	if err := os.RemoveAll(filepath.Join(s.Dir(), "volumes")); err != nil {
		t.Fatal(err)
	}
	if err := s.Writable(); err == nil {
		t.Error("Writable succeeded without a records directory")
	}
}

func mustWrite(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.VolumeID
	}
	return out
}

// A store on a read-only mount is not writable. Needs root for the mount.
func TestStore_WritableReadOnlyMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	s, err := NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Writable(); err != nil {
		t.Fatalf("Writable on a fresh tmpfs: %v", err)
	}
	if out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	if err := s.Writable(); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("Writable on a read-only mount = %v, want an error naming it", err)
	}
}

func TestStore_StampsRoundTripAndSurviveANewStore(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Stamp("iscsid-restart"); ok || err != nil {
		t.Fatalf("no stamp yet: ok %v, %v", ok, err)
	}
	at := time.Date(2026, 11, 30, 6, 41, 10, 49889000, time.FixedZone("x", 3600))
	if err := s.SetStamp("iscsid-restart", at); err != nil {
		t.Fatal(err)
	}
	again, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := again.Stamp("iscsid-restart")
	if !ok || err != nil || !got.Equal(at) {
		t.Fatalf("Stamp = %v, %v, %v; want %v", got, ok, err, at)
	}
	if recs, err := again.List(); err != nil || len(recs) != 0 {
		t.Errorf("a stamp is not a record: List = %v, %v", recs, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "stamps", "iscsid-restart"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stamp file: %v, %v", fi, err)
	}
}

func TestStore_BadStampsAreErrors(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "../volumes/x", "Upper", "a/b", strings.Repeat("a", 65)} {
		if err := s.SetStamp(name, time.Now()); err == nil {
			t.Errorf("SetStamp(%q) accepted", name)
		}
		if _, _, err := s.Stamp(name); err == nil {
			t.Errorf("Stamp(%q) accepted", name)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "stamps"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stamps", "iscsid-restart"), []byte("yesterday\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Stamp("iscsid-restart"); ok || err == nil || !strings.Contains(err.Error(), "iscsid-restart") {
		t.Errorf("malformed stamp: ok %v, %v", ok, err)
	}
}
