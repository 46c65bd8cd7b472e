package intent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// fakeDetacher records what it was asked to detach and with which
// co-tenants.
type fakeDetacher struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeDetacher) Detach(_ context.Context, rec volume.Record, co volume.CoTenants) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, rec.VolumeID+" "+string(rec.State)+" co="+strings.Join(co.IDs(), ","))
	return f.err
}

type reconcileRig struct {
	clk *clocktesting.FakeClock
	o   *Owner
	s   *volume.Store
	r   *Reconciler
	det *fakeDetacher
	mnt *mount.FakeMounter
	sys string
	dev string
}

func newReconcileRig(t *testing.T, observe bool) *reconcileRig {
	t.Helper()
	clk := fakeClock()
	o, s := newOwner(t, clk, nil)
	g := &reconcileRig{clk: clk, o: o, s: s, det: &fakeDetacher{}, mnt: mount.NewFakeMounter(nil), sys: t.TempDir(), dev: t.TempDir()}
	var err error
	g.r, err = NewReconciler(ReconcilerConfig{Timeout: 5 * time.Minute, Observe: observe}, ReconcilerDeps{
		Owner: o, Detachers: map[volume.Transport]Detacher{volume.TransportNVMeTCP: g.det},
		Mounts: g.mnt, SysFS: sysfs.New(g.sys), Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// put writes rec through a lease, as NodeStage would, at the clock's now.
func (g *reconcileRig) put(t *testing.T, rec volume.Record) {
	t.Helper()
	l, err := g.o.Lock(context.Background(), rec.Target(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := l.Put(rec); err != nil {
		t.Fatal(err)
	}
}

func (g *reconcileRig) reconcile(t *testing.T, tgt volume.Target) []Verdict {
	t.Helper()
	l, busy := g.o.TryLock(tgt, "reconcile test")
	if l == nil {
		t.Fatalf("target busy: %s", busy)
	}
	defer l.Unlock()
	return g.r.Reconcile(context.Background(), l)
}

func results(vs []Verdict) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.VolumeID+" "+string(v.Result))
	}
	return out
}

// TestReconcile_RollsBackAnAbandonedAttachOnlyAfterTheTimeout: an
// attaching record whose RPC is gone is left alone for the timeout (a
// kubelet retry resumes it), then detached with its co-tenants spared,
// and removed; a staged record is never touched.
func TestReconcile_RollsBackAnAbandonedAttachOnlyAfterTheTimeout(t *testing.T) {
	g := newReconcileRig(t, false)
	att := record(t, "pv-1", nqnA, volume.StateAttaching)
	att.Device = filepath.Join(g.dev, "nvme0n1")
	g.put(t, att)
	g.put(t, record(t, "pv-2", nqnA, volume.StateStaged))

	g.clk.Step(4 * time.Minute)
	l, _ := g.o.Scan()
	if due := g.r.Due(l); len(due) != 0 {
		t.Errorf("due after 4m: %v, want none", due)
	}
	if v := g.reconcile(t, nqnA); len(v) != 0 {
		t.Errorf("verdicts after 4m: %v", results(v))
	}

	g.clk.Step(time.Minute)
	l, _ = g.o.Scan()
	if diff := cmp.Diff([]volume.Target{nqnA}, g.r.Due(l)); diff != "" {
		t.Errorf("due after 5m (-want +got):\n%s", diff)
	}
	// An RPC on the volume holds it: reconciliation waits for it.
	end, _ := g.o.Begin("pv-1", "NodeStageVolume")
	if v := g.reconcile(t, nqnA); len(v) != 0 {
		t.Errorf("reconciled a volume an RPC holds: %v", results(v))
	}
	end()

	v := g.reconcile(t, nqnA)
	if diff := cmp.Diff([]string{"pv-1 rolled back"}, results(v)); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	// The teardown was asked for with the volume detaching and pv-2 as
	// co-tenant.
	if diff := cmp.Diff([]string{"pv-1 detaching co=pv-2"}, g.det.calls); diff != "" {
		t.Errorf("detaches (-want +got):\n%s", diff)
	}
	if _, err := g.s.Get("pv-1"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("record after rollback: %v", err)
	}
	if _, err := g.s.Get("pv-2"); err != nil {
		t.Errorf("staged co-tenant's record: %v", err)
	}
}

// TestReconcile_KeepsWhatIsInUse: a device mounted anywhere, a mount at
// the staging path or a holder in sysfs keeps the record.
func TestReconcile_KeepsWhatIsInUse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(g *reconcileRig, rec *volume.Record)
	}{
		{"device mounted elsewhere", func(g *reconcileRig, rec *volume.Record) {
			g.mnt.MountPoints = []mount.MountPoint{{Device: rec.Device, Path: "/mnt/elsewhere"}}
		}},
		{"staging path mounted", func(g *reconcileRig, rec *volume.Record) {
			g.mnt.MountPoints = []mount.MountPoint{{Device: "/dev/other", Path: rec.StagingPath}}
		}},
		{"device held", func(g *reconcileRig, rec *volume.Record) {
			if err := os.MkdirAll(filepath.Join(g.sys, "block", "nvme0n1", "holders", "dm-0"), 0o755); err != nil {
				panic(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newReconcileRig(t, false)
			rec := record(t, "pv-1", nqnA, volume.StateAttaching)
			rec.Device = filepath.Join(g.dev, "nvme0n1")
			tc.setup(g, &rec)
			g.put(t, rec)
			g.clk.Step(time.Hour)
			v := g.reconcile(t, nqnA)
			if len(v) != 1 || v[0].Result != Kept || !strings.HasPrefix(v[0].Reason, "in use: ") {
				t.Fatalf("verdicts = %+v, want kept in use", v)
			}
			if len(g.det.calls) != 0 {
				t.Errorf("detached a volume in use: %v", g.det.calls)
			}
			if _, err := g.s.Get("pv-1"); err != nil {
				t.Errorf("record of a kept volume: %v", err)
			}
		})
	}
}

// TestReconcile_FinishesADetachAndRefusesOnAnUnreadableRecord: a
// detaching record is finished at once; while a record that may be the
// target's cannot be read, nothing of the target is torn down.
func TestReconcile_FinishesADetachAndRefusesOnAnUnreadableRecord(t *testing.T) {
	g := newReconcileRig(t, false)
	g.put(t, record(t, "pv-1", nqnA, volume.StateDetaching))
	writeFuture(t, g.s, "pv-9", nqnA)
	v := g.reconcile(t, nqnA)
	if len(v) != 1 || v[0].Result != Refused || !strings.Contains(v[0].Reason, "written by a newer pathmend") {
		t.Fatalf("verdicts = %+v, want refused naming the newer record", v)
	}
	if len(g.det.calls) != 0 {
		t.Fatalf("tore down with an unreadable record: %v", g.det.calls)
	}
	if err := os.Remove(g.s.RecordPath("pv-9")); err != nil {
		t.Fatal(err)
	}
	v = g.reconcile(t, nqnA)
	if diff := cmp.Diff([]string{"pv-1 finished"}, results(v)); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	l, _ := g.s.Scan()
	if len(l.Records) != 0 {
		t.Errorf("records left: %v", l.Records)
	}
}

// TestReconcile_ObserveModeTouchesNothing and a failed teardown keeps the
// record (as detaching) for the next tick.
func TestReconcile_ObserveAndFailure(t *testing.T) {
	g := newReconcileRig(t, true)
	g.put(t, record(t, "pv-1", nqnA, volume.StateAttaching))
	g.clk.Step(time.Hour)
	if v := g.reconcile(t, nqnA); len(v) != 1 || v[0].Result != Observed {
		t.Fatalf("observe: %+v", v)
	}
	if got, _ := g.s.Get("pv-1"); got.State != volume.StateAttaching || len(g.det.calls) != 0 {
		t.Errorf("observe mode changed something: state %s, detaches %v", got.State, g.det.calls)
	}

	g = newReconcileRig(t, false)
	g.det.err = errors.New("target unreachable")
	g.put(t, record(t, "pv-1", nqnA, volume.StateAttaching))
	g.clk.Step(time.Hour)
	if v := g.reconcile(t, nqnA); len(v) != 1 || v[0].Result != Failed {
		t.Fatalf("failure: %+v", v)
	}
	got, err := g.s.Get("pv-1")
	if err != nil || got.State != volume.StateDetaching {
		t.Errorf("after a failed rollback: %+v, %v; want the record kept as detaching", got.State, err)
	}
	g.det.err = nil
	if v := g.reconcile(t, nqnA); !slices.Equal(results(v), []string{"pv-1 finished"}) {
		t.Errorf("next tick: %v", results(v))
	}
}

// TestReconcile_TwoAbandonedVolumesOfOneTargetAreBothTakenDown: the
// second rollback of one job must not count the first volume, already
// removed, as a co-tenant (found by the node simulation, seed 1).
func TestReconcile_TwoAbandonedVolumesOfOneTargetAreBothTakenDown(t *testing.T) {
	g := newReconcileRig(t, false)
	g.put(t, record(t, "pv-1", nqnA, volume.StateAttaching))
	g.put(t, record(t, "pv-2", nqnA, volume.StateDetaching))
	g.clk.Step(time.Hour)
	v := g.reconcile(t, nqnA)
	if diff := cmp.Diff([]string{"pv-1 rolled back", "pv-2 finished"}, results(v)); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"pv-1 detaching co=pv-2", "pv-2 detaching co="}, g.det.calls); diff != "" {
		t.Errorf("detaches (-want +got):\n%s", diff)
	}
}
