package uevent_test

import (
	"slices"
	"testing"

	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// summary is a relevant event as the claims below name it: action, the
// kind of the object it is about, and what a change is about.
func summary(e uevent.Event) string {
	objs := uevent.Objects(e)
	s := string(e.Action) + " " + string(objs[0].Kind)
	for _, k := range []string{"NVME_EVENT", "DM_ACTION"} {
		if v := e.Get(k); v != "" {
			s += " " + k + "=" + v
		}
	}
	return s
}

// TestRecordings_WhatTheKernelAnnounces pins, on the lab's recordings,
// what docs/performance.md says events find and what only the tick
// finds: a fault listed here announces at least these relevant events;
// a silent fault announces no relevant event at all.
func TestRecordings_WhatTheKernelAnnounces(t *testing.T) {
	recs, err := ueventtest.LoadAll("../../" + ueventtest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	announced := map[string][]string{
		"nvme-connect":           {"add nvme-controller", "change nvme-controller NVME_EVENT=connected", "add block"},
		"nvme-controller-delete": {"remove nvme-controller"},
		"nvme-reconnect":         {"add nvme-controller", "change nvme-controller NVME_EVENT=connected"},
		"nvme-port-relink":       {"change nvme-controller NVME_EVENT=connected"},
		"nvme-controller-reset":  {"change nvme-controller NVME_EVENT=connected"},
		"nvme-namespace-disable": {"remove block"},
		"nvme-namespace-enable":  {"add block"},
		"nvme-namespace-add":     {"add block"},
		"nvme-port-restore":      {"change nvme-controller NVME_EVENT=connected"},
		"nvme-ctrl-loss":         {"remove nvme-controller"},
		"nvme-disconnect-last":   {"remove block", "remove nvme-controller"},
		"iscsi-login":            {"add iscsi-session", "add scsi-device", "add block"},
		"iscsi-logout":           {"remove block", "remove scsi-device", "remove iscsi-session"},
		"iscsi-lun-rescan":       {"add scsi-device", "add block"},
		"iscsi-lun-delete":       {"remove block", "remove scsi-device"},
		"dm-map-flush":           {"remove block"},
		"dm-map-create":          {"add block"},
		// The session's own state is not announced; multipathd's failing
		// of the path in its map is.
		"iscsi-session-fail": {"change block DM_ACTION=PATH_FAILED"},
	}
	silent := []string{"nvme-port-unlink", "nvme-ana-inaccessible", "nvme-ana-restore", "nvme-port-drop", "nvme-rescan", "iscsi-session-recover"}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Fault] = true
		evs, err := r.ParsedEvents()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			if uevent.Relevant(e) {
				got = append(got, summary(e))
			}
		}
		if slices.Contains(silent, r.Fault) && len(got) > 0 {
			t.Errorf("%s: announced %v; docs/performance.md says only the tick finds it", r.Fault, got)
		}
		for _, w := range announced[r.Fault] {
			if !slices.Contains(got, w) {
				t.Errorf("%s: no %q among %v", r.Fault, w, got)
			}
		}
		for _, e := range evs {
			if objs := uevent.Objects(e); len(objs) > 0 && objs[0].Kind == uevent.NVMeLeg {
				t.Errorf("%s: a hidden leg was announced (%v); the tick reads legs", r.Fault, e)
			}
		}
	}
	for f := range announced {
		if !seen[f] {
			t.Errorf("no recording of %s", f)
		}
	}
}

// TestRecordings_EveryRelevantEventNamesAnObject: an event Relevant keeps
// names at least one object a listener can look up, and every recorded
// message parses and round-trips.
func TestRecordings_EveryRelevantEventNamesAnObject(t *testing.T) {
	recs, err := ueventtest.LoadAll("../../" + ueventtest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		evs, err := r.ParsedEvents()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if uevent.Relevant(e) {
				n++
				if len(uevent.Objects(e)) == 0 {
					t.Errorf("%s: relevant %v names no object", r.Fault, e)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no relevant event in the recordings")
	}
}
