package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// iscsiStaged are the staged iSCSI volumes of each capture, as NodeStage
// records them: the capture's target and portals, and the device the
// volume was mounted from. On iscsi-session-failed the volume uses sdb,
// the stuck session's only disk (the ladder must restart iscsid); on
// iscsi-session-free it uses sda, the healthy session's disk (a logout of
// the stuck session takes nothing in use); on iscsi-session-stuck it uses
// the multipath map, whose other path lives.
var iscsiStaged = map[string][]struct {
	volumeID, iqn, lun, device, portals string
}{
	"iscsi-healthy": {
		{"pv-iscsi-0", "iqn.2024-01.io.pathmend.lab:healthy", "0", "/dev/dm-0", labPortals},
		{"pv-iscsi-1", "iqn.2024-01.io.pathmend.lab:healthy", "1", "/dev/dm-1", labPortals},
	},
	"iscsi-session-failed": {{"pv-failing", "iqn.2024-01.io.pathmend.lab:failing", "0", "/dev/sdb", labPortals}},
	"iscsi-session-free":   {{"pv-lost", "iqn.2024-01.io.pathmend.lab:lost", "0", "/dev/sda", labPortals}},
	"iscsi-session-stuck":  {{"pv-stuck", "iqn.2024-01.io.pathmend.lab:stuck", "0", "/dev/dm-0", "127.0.0.1:3260,127.0.0.3:3260"}},
}

// labPortals are the two LIO portals of the lab captures.
const labPortals = "127.0.0.1:3260,127.0.0.2:3260"

// iscsiStateDir writes the staged iSCSI volumes of a capture into a fresh
// store, through volume.Parse like NodeStage.
func iscsiStateDir(t *testing.T, fixture string) string {
	t.Helper()
	dir := t.TempDir()
	store, err := volume.NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range iscsiStaged[fixture] {
		c, _, err := volume.Parse(map[string]string{"transport": "iscsi", "iqn": v.iqn, "portals": v.portals, "lun": v.lun}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := volume.Record{VolumeID: v.volumeID, State: volume.StateStaged, Context: c, AccessType: volume.AccessMount, FSType: "ext4",
			StagingPath: "/staging/" + v.volumeID, Device: v.device, StagedAt: diagnoseNow}
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The iSCSI captures, without and with staged records, without and
// with --plan, as tables and JSON.
func TestDiagnose_ISCSIFixtures(t *testing.T) {
	for fixture, wantCode := range map[string]int{
		"iscsi-healthy":        0,
		"iscsi-session-failed": 1,
		"iscsi-session-free":   1,
		"iscsi-session-stuck":  1,
	} {
		t.Run(fixture, func(t *testing.T) {
			root := sysRoot(t, fixture)
			for _, staged := range []bool{false, true} {
				state, name := "", fixture
				if staged {
					state, name = iscsiStateDir(t, fixture), fixture+".staged"
				}
				for _, plan := range []bool{false, true} {
					for _, format := range []string{"txt", "json"} {
						args := []string{"--sys-root", root, "--state-dir", state}
						golden := name
						if plan {
							args, golden = append(args, "--plan"), golden+".plan"
						}
						if format == "json" {
							args = append(args, "--json")
						}
						code, out, errOut := runDiagnoseAt(args...)
						if code != wantCode || errOut != "" {
							t.Errorf("%q: exit %d, want %d; stderr %q", golden+"."+format, code, wantCode, errOut)
						}
						out = strings.ReplaceAll(out, root, "$SYSROOT")
						if state != "" {
							out = strings.ReplaceAll(out, state, "$STATEDIR")
						}
						checkGolden(t, filepath.Join("testdata", "diagnose", golden+"."+format), out)
					}
				}
			}
		})
	}
}

// diagnoseJSON runs diagnose --json --plan and decodes the parts the
// iSCSI tests look at.
func diagnoseJSON(t *testing.T, args ...string) (int, []heal.Defect, []planRep, iscsiRep) {
	t.Helper()
	code, out, errOut := runDiagnoseAt(append(args, "--json", "--plan")...)
	if errOut != "" {
		t.Fatalf("stderr %q", errOut)
	}
	// heal.Scope renders as its name and has no decoder: the scopes are
	// decoded as strings; iSCSI defects are all controller scope.
	var doc struct {
		Healthy bool `json:"healthy"`
		Defects []struct {
			heal.Defect
			Scope string `json:"scope"`
		} `json:"defects"`
		Plan []struct {
			planRep
			Scope string `json:"scope"`
		} `json:"plan"`
		ISCSI iscsiRep `json:"iscsi"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Healthy != (len(doc.Defects) == 0) || len(doc.Plan) != len(doc.Defects) {
		t.Fatalf("healthy %v with %d defects and %d plan entries", doc.Healthy, len(doc.Defects), len(doc.Plan))
	}
	var defects []heal.Defect
	var plan []planRep
	for i, d := range doc.Defects {
		if d.Scope != "controller" || doc.Plan[i].Scope != "controller" {
			t.Fatalf("defect %d: scope %q, plan scope %q", i, d.Scope, doc.Plan[i].Scope)
		}
		d.Defect.Scope, doc.Plan[i].planRep.Scope = heal.ScopeController, heal.ScopeController
		defects, plan = append(defects, d.Defect), append(plan, doc.Plan[i].planRep)
	}
	return code, defects, plan, doc.ISCSI
}

// The most important iSCSI diagnose test: the healthy capture, staged or
// not, yields no defect at all, and every path reads live.
func TestDiagnose_ISCSIHealthyCaptureHasNoDefect(t *testing.T) {
	root := sysRoot(t, "iscsi-healthy")
	for _, state := range []string{"", iscsiStateDir(t, "iscsi-healthy")} {
		code, defects, _, rep := diagnoseJSON(t, "--sys-root", root, "--state-dir", state)
		if code != 0 || len(defects) != 0 {
			t.Fatalf("state dir %q: exit %d, defects %+v", state, code, defects)
		}
		if len(rep.Sessions) != 2 || len(rep.Maps) != 2 {
			t.Fatalf("%d sessions, %d maps", len(rep.Sessions), len(rep.Maps))
		}
		for _, m := range rep.Maps {
			if m.LiveSlaves != 2 || m.SessionsOfTarget != 2 || m.Target != "iqn.2024-01.io.pathmend.lab:healthy" {
				t.Errorf("map %+v", m)
			}
		}
	}
}

// The FAILED and FREE captures: one SessionDown keyed by the node record,
// tearing down the stuck session, and the ladder's structural choice.
func TestDiagnose_ISCSISessionDown(t *testing.T) {
	for _, tc := range []struct {
		fixture, state, iqn string
		staged              bool
		scope               string
		mountinfo           string // a mount table's lines; "-" for none (--mountinfo "")
		verdict             heal.Verdict
		reason              string
		volumes             []string
	}{
		{"iscsi-session-failed", "FAILED", "iqn.2024-01.io.pathmend.lab:failing", true, "staged", "", heal.Deferred,
			"would choose restart-iscsid once down ≥ 45s", []string{"pv-failing"}},
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", true, "staged", "", heal.Deferred,
			"would choose logout-login once down ≥ 45s", []string{"pv-lost"}},
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", false, "staged", "", heal.Refused,
			"out of scope: no staged volume uses target", nil},
		// Scope all: a target pathmend did not stage is in use as the node
		// shows it; without a mount table it counts as in use.
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", false, "all", "-", heal.Deferred,
			"would choose restart-iscsid once down ≥ 45s with the portal continuously reachable for 45s, refused while it is unreachable; diagnose does not probe the network, and time in state is measured by the running plugin; LUN 0: sdb has no other live path, and its target is not staged by pathmend (cannot tell who uses it)", nil},
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", false, "all", "", heal.Deferred,
			"would choose logout-login once down ≥ 45s with the portal continuously reachable for 45s, refused while it is unreachable; diagnose does not probe the network, and time in state is measured by the running plugin; LUN 0 (sdb) is not in use: sdb is not held, mounted or bound anywhere on the node", nil},
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", false, "foreign", "36 25 8:16 / /mnt/app rw,relatime shared:1 - ext4 /dev/sdb rw\n", heal.Deferred,
			"would choose restart-iscsid once down ≥ 45s with the portal continuously reachable for 45s, refused while it is unreachable; diagnose does not probe the network, and time in state is measured by the running plugin; LUN 0: sdb has no other live path and is in use on the node: sdb is mounted at /mnt/app", nil},
		// A staged volume elsewhere, but the stuck disk mounted by someone.
		{"iscsi-session-free", "FREE", "iqn.2024-01.io.pathmend.lab:lost", true, "staged", "37 25 0:5 /sdb /pods/p/dev rw - devtmpfs udev rw\n", heal.Deferred,
			"LUN 0: sdb has no other live path and is in use on the node: the device node of sdb is bound at /pods/p/dev", []string{"pv-lost"}},
	} {
		t.Run(tc.fixture+"/"+tc.scope, func(t *testing.T) {
			state := ""
			if tc.staged {
				state = iscsiStateDir(t, tc.fixture)
			}
			mi := ""
			if tc.mountinfo != "-" {
				mi = filepath.Join(t.TempDir(), "mountinfo")
				if err := os.WriteFile(mi, []byte(tc.mountinfo), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			code, defects, plan, _ := diagnoseJSON(t, "--sys-root", sysRoot(t, tc.fixture), "--state-dir", state, "--heal-iscsi-scope", tc.scope, "--mountinfo", mi)
			if code != 1 || len(defects) != 1 {
				t.Fatalf("exit %d, defects %+v", code, defects)
			}
			d := defects[0]
			want := heal.Defect{Kind: iscsi.KindSessionDown, Scope: heal.ScopeController, Key: tc.iqn + " 127.0.0.2:3260 default",
				Subject:  "session2 " + tc.iqn + " 127.0.0.2:3260 " + tc.state,
				Teardown: []heal.Path{{Name: "session2", Endpoint: "127.0.0.2:3260", State: tc.state}}, Volumes: tc.volumes}
			got := d
			got.Detail = ""
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("defect (-want +got):\n%s", diff)
			}
			if !strings.Contains(d.Detail, "last path of sdb lost (the LUN is also sda on session1, a separate device)") {
				t.Errorf("detail does not name the lost last path: %s", d.Detail)
			}
			p := plan[0]
			if p.Verdict != tc.verdict || !strings.Contains(p.Reason, tc.reason) || p.Key != d.Key {
				t.Errorf("plan %+v; want %s %q", p, tc.verdict, tc.reason)
			}
			if p.Verdict == heal.Deferred && !strings.Contains(p.Reason, "diagnose does not probe the network, and time in state is measured by the running plugin") {
				t.Errorf("plan reason does not say what a one-shot diagnosis cannot know: %s", p.Reason)
			}
		})
	}
}

// The really stuck session (open-iscsi #387) captured beside a live path
// of the volume's map: a SessionDown for the proxied portal the session
// was logged in through, whose ladder is logout-login (the map keeps sda),
// and a MapDegraded that follows it and has no kick of its own.
func TestDiagnose_ISCSIStuckCapture(t *testing.T) {
	const iqn = "iqn.2024-01.io.pathmend.lab:stuck"
	code, defects, plan, rep := diagnoseJSON(t, "--sys-root", sysRoot(t, "iscsi-session-stuck"), "--state-dir", iscsiStateDir(t, "iscsi-session-stuck"))
	if code != 1 || len(defects) != 2 {
		t.Fatalf("exit %d, defects %+v", code, defects)
	}
	down, degraded := defects[0], defects[1]
	if down.Kind != iscsi.KindSessionDown || down.Key != iqn+" 127.0.0.3:3260 default" ||
		!cmp.Equal(down.Teardown, []heal.Path{{Name: "session2", Endpoint: "127.0.0.3:3260", State: "FREE"}}) ||
		!cmp.Equal(down.Volumes, []string{"pv-stuck"}) || !strings.Contains(down.Detail, "dm-0 keeps live path sda") {
		t.Errorf("SessionDown = %+v", down)
	}
	if degraded.Kind != iscsi.KindMapDegraded || len(degraded.Teardown) != 0 || !strings.Contains(degraded.Subject, "1 of 2 paths live") {
		t.Errorf("MapDegraded = %+v", degraded)
	}
	if plan[0].Verdict != heal.Deferred || !strings.Contains(plan[0].Reason, "would choose logout-login") {
		t.Errorf("SessionDown plan %+v", plan[0])
	}
	if plan[1].Verdict != heal.Deferred || !strings.Contains(plan[1].Reason, "follows SessionDown session2") {
		t.Errorf("MapDegraded plan %+v", plan[1])
	}
	if len(rep.Maps) != 1 || rep.Maps[0].LiveSlaves != 1 || rep.Maps[0].SessionsOfTarget != 2 {
		t.Errorf("maps %+v", rep.Maps)
	}
}

// States no lab capture holds, made from the healthy capture: a session
// down under multipath, a LUN offline on a LOGGED_IN session, and a
// running disk multipathd never added to its map.
func TestDiagnoseISCSI_DerivedStates(t *testing.T) {
	base, err := iscsi.Read(sysfs.New(sysRoot(t, "iscsi-healthy")), diagnoseNow)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := volume.Parse(map[string]string{"transport": "iscsi", "iqn": "iqn.2024-01.io.pathmend.lab:healthy", "portals": "127.0.0.1:3260,127.0.0.2:3260", "lun": "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs := []volume.Record{{VolumeID: "pv-0", Context: c, Device: "/dev/dm-0"}}
	type entry struct {
		Kind    heal.Kind
		Key     string
		Verdict heal.Verdict
	}
	const iqn = "iqn.2024-01.io.pathmend.lab:healthy"
	for _, tc := range []struct {
		name   string
		change func(s *iscsi.Snapshot)
		want   []entry
		detail []string
	}{
		{"session down under multipath", func(s *iscsi.Snapshot) {
			s.Sessions[1].State = iscsi.SessionFailed
			for i := range s.Sessions[1].LUNs {
				s.Sessions[1].LUNs[i].State = iscsi.DeviceBlocked
			}
		}, []entry{
			{iscsi.KindSessionDown, iqn + " 127.0.0.2:3260 default", heal.Deferred},
			{iscsi.KindMapDegraded, "mpath-36001405576cc50fe2cb48818a080ab8f", heal.Deferred},
			{iscsi.KindMapDegraded, "mpath-360014058848e188d396406289a52c8bb", heal.Deferred},
		}, []string{
			"LUN 0: sdc blocked, dm-0 keeps live path sda",
			"dm-0 has 1 live slave(s) for 2 session(s) to " + iqn + ": sdc on session2 is blocked (session FAILED)",
		}},
		{"LUN offline on a LOGGED_IN session", func(s *iscsi.Snapshot) {
			s.Sessions[0].LUNs[1].State = iscsi.DeviceTransportOffline
		}, []entry{
			{iscsi.KindLUNNotRunning, iqn + " 127.0.0.1:3260 default lun 1", heal.Refused},
			{iscsi.KindMapDegraded, "mpath-360014058848e188d396406289a52c8bb", heal.Deferred},
		}, []string{"session1 is LOGGED_IN but its SCSI device 0:0:0:1 is transport-offline; LUN 1: sdb transport-offline, dm-1 keeps live path sdd"}},
		{"running disk not in its map", func(s *iscsi.Snapshot) {
			s.Maps[0].Slaves = []string{"sda"}
		}, []entry{
			{iscsi.KindMapDegraded, "mpath-36001405576cc50fe2cb48818a080ab8f", heal.Refused},
		}, []string{"sdc on session2 (LOGGED_IN, running) is not a slave of dm-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := cloneSnapshot(base)
			tc.change(snap)
			d := diagnoseISCSI(snap, recs, iscsiPlanConfig{Scope: iscsi.HealStaged, Threshold: iscsi.DefaultThreshold})
			var got []entry
			var details []string
			for i, def := range d.defects {
				got = append(got, entry{def.Kind, def.Key, d.plan[i].Verdict})
				details = append(details, def.Detail)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("defects (-want +got):\n%s\ndetails: %q", diff, details)
			}
			for _, want := range tc.detail {
				if !slices.ContainsFunc(details, func(s string) bool { return strings.Contains(s, want) }) {
					t.Errorf("no detail contains %q: %q", want, details)
				}
			}
			// The base snapshot, a value, is untouched.
			if base.Sessions[1].State != iscsi.SessionLoggedIn || len(base.Maps[0].Slaves) != 2 || !base.Sessions[0].LUNs[1].Running() {
				t.Fatal("the test changed the shared snapshot")
			}
		})
	}
}

// cloneSnapshot copies the parts of a snapshot the derived states change.
func cloneSnapshot(s *iscsi.Snapshot) *iscsi.Snapshot {
	c := *s
	c.Sessions = slices.Clone(s.Sessions)
	for i := range c.Sessions {
		c.Sessions[i].LUNs = slices.Clone(c.Sessions[i].LUNs)
	}
	c.Maps = slices.Clone(s.Maps)
	for i := range c.Maps {
		c.Maps[i].Slaves = slices.Clone(c.Maps[i].Slaves)
	}
	return &c
}

func TestDiagnose_ISCSIPlanFlags(t *testing.T) {
	root := sysRoot(t, "iscsi-healthy")
	for _, args := range [][]string{
		{"--sys-root", root, "--plan", "--heal-iscsi-scope", "some"},
		{"--sys-root", root, "--plan", "--iscsi-stuck-threshold", "0s"},
	} {
		code, out, errOut := runDiagnoseAt(args...)
		if code != 2 || out != "" || errOut == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}
