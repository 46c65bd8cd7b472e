package main

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

const (
	beginMarker = "<!-- uevents: rendered by `go run ./hack/lab/uevents render` from testdata/uevents; do not edit -->"
	endMarker   = "<!-- end of uevents -->"
)

// cmdRender renders the table between the doc's markers again.
func cmdRender(args []string) error {
	fs := flags("render")
	dir := fs.String("dir", ueventtest.Dir, "directory of the recordings")
	doc := fs.String("doc", "docs/uevents.md", "the document holding the table")
	fs.Parse(args)
	recs, err := ueventtest.LoadAll(*dir)
	if err != nil {
		return err
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return err
	}
	table, err := renderTable(recs)
	if err != nil {
		return err
	}
	next, err := replaceBetween(string(old), table)
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	return os.WriteFile(*doc, []byte(next), 0o644)
}

func replaceBetween(doc, table string) (string, error) {
	i := strings.Index(doc, beginMarker)
	j := strings.Index(doc, endMarker)
	if i < 0 || j < i {
		return "", fmt.Errorf("markers %q … %q not found", beginMarker, endMarker)
	}
	return doc[:i+len(beginMarker)] + "\n\n" + table + "\n" + doc[j:], nil
}

// renderTable is one row per fault: what the lab did, the relevant
// events the kernel sent (uevent.Relevant) with their delay after the
// action, and a count of the others.
func renderTable(recs []ueventtest.Recording) (string, error) {
	var b strings.Builder
	kernels := map[string]bool{}
	for _, r := range recs {
		kernels[r.Kernel] = true
	}
	fmt.Fprintf(&b, "Recorded in the lab guest (kernel %s) by `make lab-uevents`. Delays are from the start of the action to the recorder's receipt of the event, in ms.\n\n",
		strings.Join(slices.Sorted(maps.Keys(kernels)), ", "))
	b.WriteString("| fault | what the lab did | relevant events (delay, ms) | other events |\n")
	b.WriteString("| --- | --- | --- | --- |\n")
	for _, r := range recs {
		evs, err := r.ParsedEvents()
		if err != nil {
			return "", err
		}
		var rel []string
		others := map[string]int{}
		for i, e := range evs {
			if !uevent.Relevant(e) {
				others[e.Subsystem]++
				continue
			}
			rel = append(rel, fmt.Sprintf("`%s %s %s`%s %s", e.Action, e.Subsystem, e.Name(), notable(e), fmtMs(r.Events[i].DelayMs)))
		}
		relCell := "none"
		if len(rel) > 0 {
			relCell = strings.Join(rel, "<br>")
		}
		otherCell := "none"
		if len(others) > 0 {
			var parts []string
			for _, s := range slices.Sorted(maps.Keys(others)) {
				parts = append(parts, fmt.Sprintf("%s ×%d", s, others[s]))
			}
			otherCell = strings.Join(parts, ", ")
		}
		fmt.Fprintf(&b, "| `%s` | %s (until %s) | %s | %s |\n", r.Fault, cell(r.Do), cell(r.Until), relCell, otherCell)
	}
	return b.String(), nil
}

// notableKeys are the keys that say more than the action: what an NVMe
// controller change or a dm change is about, a SCSI unit attention.
var notableKeys = []string{"NVME_EVENT", "NVME_AEN", "DM_ACTION", "DM_PATH", "DM_NR_VALID_PATHS", "SDEV_UA", "SDEV_MEDIA_CHANGE", "DISK_MEDIA_CHANGE", "RESIZE", "DEVTYPE"}

func notable(e uevent.Event) string {
	var parts []string
	for _, k := range notableKeys {
		if v, ok := e.Env[k]; ok {
			if k == "DEVTYPE" && (e.Subsystem == "block" || e.Subsystem == "scsi") {
				continue // implied by the subsystem and the name
			}
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + cell(strings.Join(parts, " ")) + ")"
}

func fmtMs(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("+%.1f", ms)
	}
	return fmt.Sprintf("+%.0f", ms)
}

// cell escapes what would break a table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
