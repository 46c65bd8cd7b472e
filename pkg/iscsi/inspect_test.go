package iscsi

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// TestInspect_HealthyCaptureHasNoDefect: the real kernel's healthy node,
// two sessions under two maps, with and without staged volumes on it. A
// false positive here would have the plugin act on a healthy node.
func TestInspect_HealthyCaptureHasNoDefect(t *testing.T) {
	snap := readCapture(t, "iscsi-healthy")
	const iqn = "iqn.2024-01.io.pathmend.lab:healthy"
	for name, recs := range map[string][]volume.Record{
		"no volumes":     nil,
		"staged volumes": {rec("pv0", iqn, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2"), rec("pv1", iqn, 1, "/dev/dm-1", "127.0.0.1", "127.0.0.2")},
	} {
		if got := Inspect(snap, recs); len(got) != 0 {
			t.Errorf("%s: %d findings on a healthy node: %+v", name, len(got), got)
		}
	}
}

// TestInspect_FailedSessionIsSessionDown: the FAILED session of the
// capture is SessionDown naming the volume of its LUN, whose disk (in no
// map) has lost its last path.
func TestInspect_FailedSessionIsSessionDown(t *testing.T) {
	snap := readCapture(t, "iscsi-session-failed")
	iqn := snap.Sessions[0].TargetName
	got := Inspect(snap, []volume.Record{rec("pv0", iqn, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")})
	if len(got) != 1 {
		t.Fatalf("findings = %+v", got)
	}
	down := got[0]
	if down.Kind != KindSessionDown || down.Session != 2 || len(down.Teardown) != 1 || down.Teardown[0].State != string(SessionFailed) ||
		!cmp.Equal(down.Volumes, []string{"pv0"}) || !strings.Contains(down.Detail, "last path of sdb lost (the LUN is also sda on session1, a separate device)") {
		t.Errorf("SessionDown = %+v", down)
	}
}

// TestInspect_StuckSessionAndTheMapThatFollowsIt: the really stuck
// session (open-iscsi #387) beside a live path of the volume's map is
// SessionDown, and the map is MapDegraded following it only.
func TestInspect_StuckSessionAndTheMapThatFollowsIt(t *testing.T) {
	snap := readCapture(t, "iscsi-session-stuck")
	iqn := snap.Sessions[0].TargetName
	got := Inspect(snap, []volume.Record{rec("pv-stuck", iqn, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.3")})
	if len(got) != 2 {
		t.Fatalf("findings = %+v", got)
	}
	down, degraded := got[0], got[1]
	if down.Kind != KindSessionDown || !cmp.Equal(down.Volumes, []string{"pv-stuck"}) || !strings.Contains(down.Detail, "dm-0 keeps live path sda") {
		t.Errorf("SessionDown = %+v", down)
	}
	if degraded.Kind != KindMapDegraded || !degraded.FollowsOnly || !cmp.Equal(degraded.Follows, []string{"SessionDown " + down.Session.String()}) ||
		!strings.Contains(degraded.Subject, "1 of 2 paths live") || !cmp.Equal(degraded.Volumes, []string{"pv-stuck"}) {
		t.Errorf("MapDegraded = %+v", degraded)
	}
}

// TestInspect_LUNNotRunningOnALoggedInSession: a LUN the kernel blocked
// under a LOGGED_IN session is a defect of its own; a running one is
// not.
func TestInspect_LUNNotRunningOnALoggedInSession(t *testing.T) {
	const iqn = iqnT
	s := sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"), disk(1, "sdb"))
	s.LUNs[1].State = DeviceBlocked
	snap := &Snapshot{Sessions: []Session{s}}
	got := Inspect(snap, []volume.Record{rec("pv", iqn, 1, "/dev/sdb", "127.0.0.1")})
	want := heal.Defect{Kind: KindLUNNotRunning, Scope: heal.ScopeController, Key: s.Node().HealKey() + " lun 1",
		Subject: "session1 " + iqn + " LUN 1 (sdb) blocked", Teardown: []heal.Path{}, Volumes: []string{"pv"}}
	if len(got) != 1 {
		t.Fatalf("findings = %+v", got)
	}
	g := got[0].Defect
	g.Detail = ""
	if diff := cmp.Diff(want, g); diff != "" {
		t.Errorf("defect (-want +got):\n%s", diff)
	}
	if !strings.Contains(got[0].Detail, "in no multipath map: last path of sdb lost") {
		t.Errorf("detail = %s", got[0].Detail)
	}
}
