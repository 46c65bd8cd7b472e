// Package ueventtest is test support: the recordings of the kernel's
// uevents the lab made while it ran its fault catalogue (make
// lab-uevents), stored in testdata/uevents as one JSON file per fault,
// and helpers that replay them into a uevent.Source through a fake Conn.
// Nothing of it is in the production binary.
package ueventtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// Recording is what the kernel announced during one fault of the lab's
// catalogue.
type Recording struct {
	// Fault names the fault ("nvme-controller-delete").
	Fault string `json:"fault"`
	// Do is what the lab did, as a shell command or a sentence.
	Do string `json:"do"`
	// Until is what the lab waited for before it stopped recording the
	// fault (the state sysfs showed), plus a settling time.
	Until string `json:"until"`
	// Kernel is the guest's kernel release and Debian version.
	Kernel string `json:"kernel"`
	// WindowMs is how long after the action the fault's events were
	// recorded, in milliseconds.
	WindowMs float64 `json:"windowMs"`
	// Events are every uevent the kernel sent in the window, in order.
	Events []Recorded `json:"events"`
}

// Recorded is one uevent as recorded: every key the kernel sent, and when
// the recorder received it after the action began.
type Recorded struct {
	DelayMs float64           `json:"delayMs"`
	Env     map[string]string `json:"env"`
}

// Event parses the recorded keys as a message the kernel would send
// (uevent.Encode, uevent.Parse).
func (r Recorded) Event() (uevent.Event, error) {
	e := uevent.Event{Action: uevent.Action(r.Env["ACTION"]), DevPath: r.Env["DEVPATH"], Env: r.Env}
	return uevent.Parse(uevent.Encode(e))
}

// Events parses every recorded event.
func (r Recording) ParsedEvents() ([]uevent.Event, error) {
	out := make([]uevent.Event, 0, len(r.Events))
	for i, re := range r.Events {
		e, err := re.Event()
		if err != nil {
			return nil, fmt.Errorf("%s: event %d: %w", r.Fault, i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Load reads one recording.
func Load(path string) (Recording, error) {
	var r Recording
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	if r.Fault == "" || r.Fault+".json" != filepath.Base(path) {
		return r, fmt.Errorf("%s: fault %q does not match the file name", path, r.Fault)
	}
	return r, nil
}

// LoadAll reads every recording in dir, in the order of the catalogue
// (Order), then the rest by name.
func LoadAll(dir string) ([]Recording, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, errors.New("no recording in " + dir)
	}
	var out []Recording
	for _, f := range files {
		r, err := Load(f)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b Recording) int {
		ia, ib := orderOf(a.Fault), orderOf(b.Fault)
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a.Fault, b.Fault)
	})
	return out, nil
}

// Dir is the directory of the recordings, relative to the repository
// root.
const Dir = "testdata/uevents"

// Save writes r as dir/<fault>.json, indented, keys sorted.
func Save(dir string, r Recording) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, r.Fault+".json"), append(b, '\n'), 0o644)
}

func orderOf(fault string) int {
	if i := slices.Index(Order, fault); i >= 0 {
		return i
	}
	return len(Order)
}

// Order is the lab's fault catalogue in the order it runs
// (hack/lab/guest/uevents.sh): each fault starts from the state the one
// before left.
var Order = []string{
	"nvme-connect", "nvme-connect-second",
	"nvme-controller-delete", "nvme-reconnect",
	"nvme-port-unlink", "nvme-port-relink",
	"nvme-ana-inaccessible", "nvme-ana-restore",
	"nvme-controller-reset", "nvme-rescan",
	"nvme-namespace-disable", "nvme-namespace-enable", "nvme-namespace-add",
	"nvme-port-drop", "nvme-port-restore",
	"nvme-ctrl-loss", "nvme-disconnect-last",
	"iscsi-login", "iscsi-login-second",
	"iscsi-session-fail", "iscsi-session-recover",
	"iscsi-logout", "iscsi-login-again",
	"iscsi-lun-rescan", "iscsi-lun-delete",
	"dm-map-flush", "dm-map-create",
	"iscsi-logout-last",
}
