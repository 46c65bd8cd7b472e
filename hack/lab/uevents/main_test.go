package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// TestDocTableIsRendered: docs/uevents.md's table is what render makes of
// the committed recordings (go run ./hack/lab/uevents render).
func TestDocTableIsRendered(t *testing.T) {
	recs, err := ueventtest.LoadAll("../../../" + ueventtest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	table, err := renderTable(recs)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/uevents.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := replaceBetween(string(doc), table)
	if err != nil {
		t.Fatal(err)
	}
	if want != string(doc) {
		t.Error("docs/uevents.md's table is not rendered from testdata/uevents: run go run ./hack/lab/uevents render")
	}
}

// TestRecordingsAreTheCatalogue: one recording per fault of the
// catalogue, none other.
func TestRecordingsAreTheCatalogue(t *testing.T) {
	files, _ := filepath.Glob("../../../" + ueventtest.Dir + "/*.json")
	got := map[string]bool{}
	for _, f := range files {
		got[strings.TrimSuffix(filepath.Base(f), ".json")] = true
	}
	for _, f := range ueventtest.Order {
		if !got[f] {
			t.Errorf("no recording of %s", f)
		}
		delete(got, f)
	}
	for f := range got {
		t.Errorf("recording %s is not in the catalogue", f)
	}
}

func TestSplit_FramesEventsByMarks(t *testing.T) {
	ev := []line{
		{T: 5, Env: map[string]string{"ACTION": "add", "DEVPATH": "/x", "SUBSYSTEM": "a", "SEQNUM": "1"}},
		{T: 15, Env: map[string]string{"ACTION": "remove", "DEVPATH": "/x", "SUBSYSTEM": "a", "SEQNUM": "2"}},
		{T: 25, Env: map[string]string{"ACTION": "add", "DEVPATH": "/y", "SUBSYSTEM": "a", "SEQNUM": "3"}},
	}
	mk := []line{{T: 10_000_000, Fault: "f", Phase: "begin", Do: "x"}, {T: 20_000_000, Fault: "f", Phase: "end", Until: "y"}}
	for i := range ev {
		ev[i].T *= 1_000_000
	}
	recs, err := split(ev, mk, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || len(recs[0].Events) != 1 || recs[0].Events[0].Env["SEQNUM"] != "2" || recs[0].Events[0].DelayMs != 5 || recs[0].WindowMs != 10 {
		t.Fatalf("%+v", recs)
	}
	if _, err := split(ev, []line{{T: 1, Fault: "f", Phase: "begin"}}, "k"); err == nil {
		t.Error("a fault that does not end was split")
	}
	lost := append(ev, line{T: 16_000_000, Lost: []string{"socket"}})
	if _, err := split(lost, mk, "k"); err == nil {
		t.Error("a window with a loss was split")
	}
}
