package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/nvme"
)

const healthyA = "nqn.2024-01.io.pathmend.lab:healthy-a"

// learnedDir writes what companion mode learned of the healthy capture's
// subsystem healthy-a: its two live endpoints, and a third the kernel
// gave up.
func learnedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := companion.NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ep := func(port string, state nvme.ControllerState, gone bool) companion.Endpoint {
		e := companion.Endpoint{
			Endpoint: nvme.Endpoint{Transport: "tcp", Traddr: "127.0.0.1", Trsvcid: port}, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:driver",
			CtrlLossTmo: nvme.Timeout{Seconds: 20}, ReconnectDelay: nvme.Timeout{Seconds: 2}, FastIOFailTmo: nvme.Timeout{Off: true}, KATO: 5,
			Params: nvme.ConnectParams{HostID: "d0d0d0d0-0000-4000-8000-000000000001", QueueCount: 3, SQSize: 127}, LastState: state,
			FirstSeen: diagnoseNow.Add(-time.Hour),
		}
		if gone {
			e.GoneSince = diagnoseNow.Add(-time.Minute)
		}
		return e
	}
	if err := s.Put(companion.Subsystem{NQN: healthyA, Endpoints: []companion.Endpoint{
		ep("4420", nvme.StateLive, false), ep("4421", nvme.StateLive, false), ep("4422", nvme.StateConnecting, true),
	}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDiagnose_ShowsLearnedEndpointsAndWhatCompanionModeWouldDo: the
// learned endpoints are listed with their options, and --plan says the
// given-up one would be reconnected; a healthy node stays healthy.
func TestDiagnose_ShowsLearnedEndpointsAndWhatCompanionModeWouldDo(t *testing.T) {
	root, state := sysRoot(t, "nvme-healthy"), learnedDir(t)
	var out, errb bytes.Buffer
	if code := diagnose([]string{"--sys-root", root, "--state-dir", state, "--json", "--plan"}, &out, &errb, func() time.Time { return diagnoseNow }); code != diagnoseHealthy {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Learned []learnedRep `json:"learned"`
		Plan    []struct {
			Kind, Key string
		} `json:"plan"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range rep.Learned {
		got = append(got, l.Endpoint+" "+l.Status)
	}
	want := []string{"tcp 127.0.0.1:4420 present", "tcp 127.0.0.1:4421 present", "tcp 127.0.0.1:4422 given up"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("learned (-want +got):\n%s", diff)
	}
	if o := rep.Learned[2].Options; !strings.Contains(o, "hostnqn=nqn.2014-08.org.nvmexpress:uuid:driver") || !strings.Contains(o, "ctrl_loss_tmo=20") {
		t.Errorf("options %q", o)
	}
	if len(rep.Plan) != 1 || rep.Plan[0].Kind != string(kindReconnect) || rep.Plan[0].Key != healthyA+" tcp 127.0.0.1:4422" {
		t.Errorf("plan %+v, want one reconnect of 4422", rep.Plan)
	}
	out.Reset()
	if code := diagnose([]string{"--sys-root", root, "--state-dir", state}, &out, &errb, func() time.Time { return diagnoseNow }); code != diagnoseHealthy {
		t.Fatalf("table: exit %d", code)
	}
	if !strings.Contains(out.String(), "Learned NVMe endpoints (companion mode") || !strings.Contains(out.String(), "given up") {
		t.Errorf("table lacks the learned endpoints:\n%s", out.String())
	}
}

// TestDiagnose_AnUnreadableLearnedFileIsNotHealthy: a learned file a newer
// pathmend wrote blocks companion mode on its subsystem; diagnose lists it
// and exits 1.
func TestDiagnose_AnUnreadableLearnedFileIsNotHealthy(t *testing.T) {
	root, state := sysRoot(t, "nvme-healthy"), t.TempDir()
	s, err := companion.NewStore(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "sub-00000000000000000000000000000000.json"), []byte(`{"version": 7, "nqn": "nqn.x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := diagnose([]string{"--sys-root", root, "--state-dir", state}, &out, &errb, func() time.Time { return diagnoseNow }); code != diagnoseDefects {
		t.Fatalf("exit %d, want %d: %s", code, diagnoseDefects, out.String())
	}
	if !strings.Contains(out.String(), "written by a newer pathmend (version 7)") {
		t.Errorf("report:\n%s", out.String())
	}
}
