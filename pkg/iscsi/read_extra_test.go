package iscsi

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A connection's address and port answer ENOTCONN while it is down, and
// may start to between the read of its state and theirs. sysfs.FS reads
// regular files, and no regular file answers open(2) or read(2) with
// ENOTCONN (an err fixture entry becomes a mode-0000 file: EACCES for a
// non-root reader, its text "ENOTCONN" for root), so the tolerance of
// readConnected cannot be exercised on a file tree. What can be: a
// connection that is not up has its address and port never read at all,
// and, when it is up, any failure other than ENOTCONN is an error naming
// the attribute. An attribute replaced by a directory fails every read
// (EISDIR), whoever runs the test.
func TestRead_ConnectionAddressAndPortAreReadOnlyWhileUp(t *testing.T) {
	const conn = "class/iscsi_connection/connection2:0/"
	unreadable := func(t *testing.T, dir string, attrs ...string) {
		t.Helper()
		for _, a := range attrs {
			p := filepath.Join(dir, conn+a)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	setConnState := func(t *testing.T, dir, state string) {
		t.Helper()
		p := filepath.Join(dir, conn+"state")
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(state+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	for _, st := range []ConnState{ConnFailed, ConnDown, ConnBound} {
		t.Run("connection "+string(st), func(t *testing.T) {
			fsys, dir := tree(t, twoPortals())
			setConnState(t, dir, string(st))
			unreadable(t, dir, "address", "port")
			snap, err := Read(fsys, t0)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			s, ok := snap.Session(2)
			if !ok {
				t.Fatal("session2 missing")
			}
			want := []Connection{{ID: ConnectionID{Session: 2}, State: st, PersistentAddress: "127.0.0.2", PersistentPort: 3260}}
			if diff := cmp.Diff(want, s.Connections); diff != "" {
				t.Errorf("connection (-want +got):\n%s", diff)
			}
			if p := s.PortalString(); p != "127.0.0.2:3260" {
				t.Errorf("portal %q, want the persistent one", p)
			}
		})
	}

	for _, attr := range []string{"address", "port"} {
		t.Run("connection up, "+attr+" unreadable", func(t *testing.T) {
			fsys, dir := tree(t, twoPortals())
			unreadable(t, dir, attr)
			_, err := Read(fsys, t0)
			if err == nil || !strings.Contains(err.Error(), conn+attr) {
				t.Fatalf("Read = %v, want an error naming %s", err, conn+attr)
			}
			if errors.Is(err, syscall.ENOTCONN) || !errors.Is(err, syscall.EISDIR) {
				t.Errorf("Read = %v, want the EISDIR of the read", err)
			}
		})
	}

	t.Run("connection up, both readable", func(t *testing.T) {
		fsys, _ := tree(t, twoPortals())
		snap, err := Read(fsys, t0)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := snap.Session(2)
		want := []Connection{{ID: ConnectionID{Session: 2}, State: ConnUp, PersistentAddress: "127.0.0.2", PersistentPort: 3260, Address: "127.0.0.2", Port: 3260}}
		if diff := cmp.Diff(want, s.Connections); diff != "" {
			t.Errorf("connection (-want +got):\n%s", diff)
		}
	})
}

// Whatever ParseHostID accepts is a non-negative host number that prints
// back to the same name; whatever it rejects is an error quoting the name.
func FuzzParseHostID(f *testing.F) {
	for _, s := range []string{"host0", "host10", "host999999999", "host1000000000", "host", "host01", "host-1", "host+1", "Host1", "host 1", "host1 ", "scsi_host0", "0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHostID(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("%q: error %q does not quote the name", s, err)
			}
			return
		}
		if h < 0 || h.String() != s {
			t.Fatalf("%q parsed to %d, prints %q", s, h, h.String())
		}
		if back, err := ParseHostID(h.String()); err != nil || back != h {
			t.Fatalf("%q: %d does not parse back (%d, %v)", s, h, back, err)
		}
	})
}
