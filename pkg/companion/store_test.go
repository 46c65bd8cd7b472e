package companion

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme"
)

func learnedOne(t *testing.T) Subsystem {
	t.Helper()
	state, _, _, _ := Learn(nil, map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive), ctrl("nvme1", "10.0.0.2", nvme.StateConnecting)}}, time.Hour, t0)
	return state[nqnX]
}

// TestStore_RoundTripsAtomicallyWithMode0600 writes, reads back equal,
// leaves no temporary file and keeps the file private.
func TestStore_RoundTripsAtomicallyWithMode0600(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sub := learnedOne(t)
	if err := s.Put(sub); err != nil {
		t.Fatal(err)
	}
	got, bad, err := s.Load()
	if err != nil || len(bad) != 0 {
		t.Fatalf("Load: %v %v", bad, err)
	}
	if diff := cmp.Diff(map[string]Subsystem{nqnX: sub}, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	entries, _ := os.ReadDir(s.Dir())
	if len(entries) != 1 {
		t.Fatalf("files = %v, want one", entries)
	}
	if fi, _ := entries[0].Info(); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(s.Dir()); fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	if err := s.Delete(nqnX); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(nqnX); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if got, _, _ := s.Load(); len(got) != 0 {
		t.Errorf("after delete: %v", got)
	}
}

// TestStore_FailsClosedOnWhatItCannotRead: a newer version, corrupt JSON
// and a file under another subsystem's name are unreadable, each with
// the NQN its envelope names; a temporary file is ignored.
func TestStore_FailsClosedOnWhatItCannotRead(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) string {
		p := filepath.Join(s.Dir(), name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newer := write(learnedName("nqn.a"), `{"version": 2, "nqn": "nqn.a", "endpoints": [], "somethingNew": true}`)
	corrupt := write(learnedName("nqn.b"), `{"version": 1, "nqn": `)
	moved := write(learnedName("nqn.c"), `{"version": 1, "nqn": "nqn.d", "endpoints": []}`)
	write(".tmp-"+learnedName("nqn.e")+"-123", `garbage`)
	_, bad, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, u := range bad {
		got[u.Path] = u.NQN + ": " + u.Err.Error()
	}
	for p, want := range map[string]string{
		newer:   "nqn.a: written by a newer pathmend (version 2)",
		corrupt: ": not a learned subsystem",
		moved:   "nqn.d: file name does not match its NQN",
	} {
		if !strings.HasPrefix(got[p], want) {
			t.Errorf("%s: %q, want prefix %q", filepath.Base(p), got[p], want)
		}
	}
	if len(bad) != 3 {
		t.Errorf("unreadable = %v, want 3", bad)
	}
}

// TestStore_RefusesToWriteWhatItCouldNotRead: bad NQNs and endpoints
// whose options would not encode are never written.
func TestStore_RefusesToWriteWhatItCouldNotRead(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sub := learnedOne(t)
	sub.NQN = "nqn.x,hostnqn=evil"
	if err := s.Put(sub); err == nil {
		t.Error("an NQN with a separator was written")
	}
	sub = learnedOne(t)
	sub.Endpoints[0].HostIface = "eth0,nr_io_queues=1"
	if err := s.Put(sub); err == nil {
		t.Error("an endpoint whose options smuggle an option was written")
	}
}
