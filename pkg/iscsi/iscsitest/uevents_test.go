package iscsitest_test

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

func summary(e uevent.Event) string {
	return string(e.Action) + " " + e.Subsystem + " " + string(uevent.Objects(e)[0].Kind)
}

// TestHost_AnnouncesWhatTheLabsKernelAnnounces drives the fake host
// through the iSCSI faults of the lab's catalogue (multipathd running,
// find_multipaths no, as in the lab) and compares what it announces with
// what the 6.1 kernel and multipathd announced (testdata/uevents): the
// relevant events, in order, names aside.
func TestHost_AnnouncesWhatTheLabsKernelAnnounces(t *testing.T) {
	recs, err := ueventtest.LoadAll("../../../" + ueventtest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string][]string{}
	for _, r := range recs {
		evs, err := r.ParsedEvents()
		if err != nil {
			t.Fatal(err)
		}
		recorded[r.Fault] = []string{}
		for _, e := range evs {
			if uevent.Relevant(e) {
				recorded[r.Fault] = append(recorded[r.Fault], summary(e))
			}
		}
	}
	dir := t.TempDir()
	h, err := iscsitest.NewHost(filepath.Join(dir, "sys"), filepath.Join(dir, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	h.MapSingle = true
	run := func(args ...string) {
		t.Helper()
		if out, err := h.Exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	login := func(portal string) { run("iscsiadm", "-m", "node", "-T", h.Target, "-p", portal, "--login") }
	run("iscsiadm", "-m", "discovery", "-t", "sendtargets", "-p", "127.0.0.1:3260")
	h.Announce()
	for _, step := range []struct {
		fault string
		do    func()
	}{
		{"iscsi-login", func() { login("127.0.0.1:3260") }},
		{"iscsi-login-second", func() { login("127.0.0.2:3260") }},
		{"iscsi-logout", func() { run("iscsiadm", "-m", "session", "-r", "2", "-u") }},
		{"iscsi-login-again", func() { login("127.0.0.2:3260") }},
		{"iscsi-lun-delete", func() {
			if err := h.WriteAttr("block/sda/device/delete", "1"); err != nil {
				t.Fatal(err)
			}
		}},
		{"dm-map-flush", func() { run("multipath", "-f", "mpatha") }},
	} {
		step.do()
		got := []string{}
		for _, e := range h.TakeUevents() {
			if uevent.Relevant(e) {
				got = append(got, summary(e))
			}
		}
		if len(recorded[step.fault]) == 0 {
			t.Fatalf("no relevant event recorded for %s", step.fault)
		}
		if diff := cmp.Diff(recorded[step.fault], got); diff != "" {
			t.Errorf("%s: announced (-lab's kernel +fake):\n%s", step.fault, diff)
		}
	}
}
