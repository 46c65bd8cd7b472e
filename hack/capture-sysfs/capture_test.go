package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// TestCapture_CommittedFixturesRecaptureUnchanged materializes every
// fixture captured in the lab and captures the materialized tree again:
// the walk must find exactly the same entries (what it follows, what it
// skips, wo and err attributes) with the same directory ages.
func TestCapture_CommittedFixturesRecaptureUnchanged(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/fixtures/*.sysfs")
	if len(paths) == 0 {
		t.Skip("no committed fixtures")
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			want, err := sysfstest.LoadFixture(p)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := want.Materialize(dir, now); err != nil {
				t.Fatal(err)
			}
			got, err := capture(dir, now)
			if err != nil {
				t.Fatal(err)
			}
			testneed.Root(t, "recapturing mode-0000 attributes")
			if diff := cmp.Diff(want.Entries, got.Entries); diff != "" {
				t.Errorf("recapture differs (-fixture +recapture):\n%s", diff)
			}
		})
	}
}

func TestSanitize_ReplacesHostIdentitiesConsistently(t *testing.T) {
	const hostnqn = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"
	const hostid = "11111111-2222-4333-8444-555555555555"
	const iname = "iqn.1993-08.org.debian:01:abcdef"
	f := &sysfstest.Fixture{Entries: []sysfstest.Entry{
		{Kind: sysfstest.KindFile, Path: "c/nvme0/hostnqn", Mode: 0o444, Value: hostnqn + "\n"},
		{Kind: sysfstest.KindFile, Path: "c/nvme1/hostnqn", Mode: 0o444, Value: hostnqn + "\n"},
		{Kind: sysfstest.KindFile, Path: "c/nvme0/hostid", Mode: 0o444, Value: hostid + "\n"},
		{Kind: sysfstest.KindFile, Path: "c/nvme0/subsysnqn", Mode: 0o444, Value: "nqn.2024-01.io.pathmend.lab:keep\n"},
		{Kind: sysfstest.KindFile, Path: "s/session1/initiatorname", Mode: 0o444, Value: iname + "\n"},
		{Kind: sysfstest.KindFile, Path: "s/session1/targetname", Mode: 0o444, Value: "iqn.2024-01.io.pathmend.lab:keep\n"},
		{Kind: sysfstest.KindFile, Path: "h/host2/initiatorname", Mode: 0o444, Value: "(null)\n"},
		{Kind: sysfstest.KindFile, Path: "x/mentions", Mode: 0o444, Value: "host " + hostnqn + " id " + hostid + "\n"},
	}}
	kinds := sanitize(f)
	if diff := cmp.Diff([]string{"hostnqn", "hostid", "initiatorname"}, kinds); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
	fakeNQN := "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001\n"
	want := []string{
		fakeNQN, fakeNQN,
		"00000000-0000-4000-8000-000000000001\n",
		"nqn.2024-01.io.pathmend.lab:keep\n",
		"iqn.2004-10.com.example:pathmend-node-1\n",
		"iqn.2024-01.io.pathmend.lab:keep\n",
		"(null)\n",
		"host nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001 id 00000000-0000-4000-8000-000000000001\n",
	}
	for i, e := range f.Entries {
		if e.Value != want[i] {
			t.Errorf("%s = %q, want %q", e.Path, e.Value, want[i])
		}
	}
}

func TestRun_SummaryOfAFixture(t *testing.T) {
	p := "../../testdata/fixtures/nvme-healthy.sysfs"
	if _, err := os.Stat(p); err != nil {
		t.Skip("nvme-healthy fixture not captured yet")
	}
	var out bytes.Buffer
	if err := run([]string{"-summary", "-fixture", p}, &out, time.Now); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"native multipath: Y", "healthy-a", "healthy-b", "ana_state=optimized", "ana_state=non-optimized"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, out.String())
		}
	}
	if strings.Contains(out.String(), "no leg") {
		t.Errorf("healthy summary reports a missing leg:\n%s", out.String())
	}
}

func TestRedactSecrets(t *testing.T) {
	f := &sysfstest.Fixture{Entries: []sysfstest.Entry{
		{Kind: sysfstest.KindFile, Path: "class/iscsi_session/session1/password", Value: "chap-secret-123\n"},
		{Kind: sysfstest.KindFile, Path: "class/iscsi_session/session1/password_in", Value: "(null)\n"},
		{Kind: sysfstest.KindFile, Path: "class/nvme/nvme0/dhchap_secret", Value: "DHHC-1:00:abc:\n"},
		{Kind: sysfstest.KindFile, Path: "class/nvme/nvme0/dhchap_ctrl_secret", Value: "none\n"},
		{Kind: sysfstest.KindFile, Path: "class/iscsi_session/session1/username", Value: "lab-user\n"},
	}}
	if n := redactSecrets(f); n != 2 {
		t.Errorf("redacted %d values, want 2", n)
	}
	want := []string{"<redacted>\n", "(null)\n", "<redacted>\n", "none\n", "lab-user\n"}
	for i, e := range f.Entries {
		if e.Value != want[i] {
			t.Errorf("%s = %q, want %q", e.Path, e.Value, want[i])
		}
	}
}
