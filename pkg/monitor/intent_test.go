package monitor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	nvmeattach "github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/volume"
)

// writeNewer writes a record of volumeID on nqn as a newer pathmend would.
func (r *rig) writeNewer(t *testing.T, volumeID, nqn string) string {
	t.Helper()
	path := r.store.RecordPath(volumeID)
	data := fmt.Sprintf(`{"version": %d, "volumeID": %q, "context": {"transport": "nvme-tcp", "nvme": {"nqn": %q}}}`, volume.RecordVersion+1, volumeID, nqn)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTick_UnreadableRecordRefusesTeardownOfItsTargetOnly: a record a
// newer pathmend wrote for nqnA blocks every teardown of nqnA (the verdict
// says why) and nothing of nqnB.
func TestTick_UnreadableRecordRefusesTeardownOfItsTargetOnly(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"), rec("vol-b", nqnB, "127.0.0.3", "127.0.0.4"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.connectAged(t, nqnB, "127.0.0.3", "127.0.0.4")
	r.k.DropLegs(1) // nqnA's second controller contributes no path
	r.k.DropLegs(3) // nqnB's second controller contributes no path
	file := r.writeNewer(t, "vol-x", nqnA)
	before := len(r.k.Calls())

	rep := r.m.Tick(context.Background())
	if diff := cmp.Diff([]string{file}, rep.Unreadable); diff != "" {
		t.Errorf("unreadable (-want +got):\n%s", diff)
	}
	verdicts := map[string]heal.Outcome{}
	for _, o := range rep.Outcomes {
		verdicts[o.Defect.Key] = o
	}
	a := verdicts[nqnA+" tcp 127.0.0.2:4420"]
	if a.Verdict != heal.Refused || !strings.HasPrefix(a.Reason, "unreadable record: ") || !strings.Contains(a.Reason, file) {
		t.Errorf("nqnA outcome = %+v, want refused naming %s", a, file)
	}
	if b := verdicts[nqnB+" tcp 127.0.0.4:4420"]; b.Verdict != heal.Repaired {
		t.Errorf("nqnB outcome = %+v, want repaired", b)
	}
	want := []string{"delete nvme3", "connect 127.0.0.4:4420"}
	if diff := cmp.Diff(want, r.callsSince(before)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if st, _ := r.m.Status("vol-a"); len(st.Notes) == 0 || !strings.Contains(st.Notes[0], "refused: unreadable record") {
		t.Errorf("vol-a notes = %v", st.Notes)
	}
}

// reconcileRig adds the reconciliation of interrupted intents.
func reconcileRig(t *testing.T) *rig {
	t.Helper()
	r := newRig(t, heal.ModeRepair, nil)
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: r.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	att, err := nvmeattach.NewAttacher(nvmeattach.AttacherConfig{SysFS: r.k.FS(), DevRoot: "/dev", Connector: r.k, Host: r.m.deps.Host, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := intent.NewReconciler(intent.ReconcilerConfig{Timeout: 5 * time.Minute}, intent.ReconcilerDeps{
		Owner: r.owner, Mounts: mount.NewFakeMounter(nil), SysFS: r.k.FS(), Clock: r.clk,
		Detachers: map[volume.Transport]intent.Detacher{volume.TransportNVMeTCP: att},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.m.deps.Reconciler = rc
	return r
}

// TestTick_AnAbandonedAttachIsNotReconnectedAndRolledBackAfterTheTimeout:
// a stage that crashed after connecting one path leaves an attaching
// record. The monitor protects it but does not reconnect its other path;
// once the record is older than the timeout with no RPC in flight, the
// tick rolls it back: the controller goes, the record goes.
func TestTick_AnAbandonedAttachIsNotReconnectedAndRolledBackAfterTheTimeout(t *testing.T) {
	r := reconcileRig(t)
	att := rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2")
	att.State = volume.StateAttaching
	att.StateSince = r.clk.Now()
	r.set(t, att)
	r.connectAged(t, nqnA, "127.0.0.1") // an hour: past the timeout
	before := len(r.k.Calls())

	rep := r.m.Tick(context.Background())
	if len(rep.Intents) != 1 || rep.Intents[0].Result != intent.RolledBack {
		t.Fatalf("intents = %+v, want vol-a rolled back", rep.Intents)
	}
	if diff := cmp.Diff([]string{"delete nvme0"}, r.callsSince(before)); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if _, err := r.store.Get("vol-a"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("record after the rollback: %v", err)
	}
}

func TestTick_AnAttachingVolumeIsNotReconnected(t *testing.T) {
	r := reconcileRig(t)
	r.connectAged(t, nqnA, "127.0.0.1")
	att := rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2")
	att.State, att.StateSince = volume.StateAttaching, r.clk.Now()
	r.set(t, att)
	before := len(r.k.Calls())
	// Younger than the timeout: left to its NodeStage.
	rep := r.m.Tick(context.Background())
	if calls := r.callsSince(before); len(calls) != 0 || len(rep.Intents) != 0 {
		t.Errorf("acted on an attaching volume: calls %v, intents %+v", calls, rep.Intents)
	}
}
