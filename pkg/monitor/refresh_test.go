package monitor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// A kernel event names one controller: the model says which target it
// serves, and RefreshTarget reads that target's objects alone and writes
// its volumes — another target's entry keeps its read — without a tick;
// a tick whose read began before the refresh does not overwrite it.
func TestRefreshTarget_ReadsAndWritesOneTarget(t *testing.T) {
	r := newRigKernel(t, heal.ModeObserve, nil, func(f func()) { f() }, nvmetest.NewKernelInPlace)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"), rec("vol-b", nqnB, "127.0.0.3", "127.0.0.4"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.connectAged(t, nqnB, "127.0.0.3", "127.0.0.4")
	ctx := context.Background()
	r.m.Tick(ctx)
	ticked := r.clk.Now()
	snap := r.m.deps.Model.Snapshot()
	tg, ok := snap.TargetOf("nvme1")
	if !ok || tg != (volume.Target{Transport: volume.TransportNVMeTCP, Name: nqnA}) {
		t.Fatalf("TargetOf(nvme1) = %v, %v", tg, ok)
	}

	r.clk.Step(time.Second)
	r.k.SetState(1, "connecting")
	early := r.m.deps.Model.Stamp(r.clk.Now()) // a tick's read that begins now, before the refresh
	before := r.tr.Reader().Counts()
	if err := r.m.RefreshTarget(ctx, tg); err != nil {
		t.Fatal(err)
	}
	reads := r.tr.Reader().Counts().Reads - before.Reads
	a, _ := r.status("vol-a")
	b, _ := r.status("vol-b")
	if live, _ := a.Live(); live != 1 || !a.ReadAt.Equal(r.clk.Now()) || !strings.Contains(a.Condition.Message, "nvme1 connecting") {
		t.Errorf("vol-a after the refresh of its target: %+v", a)
	}
	if a.Paths[1].State != model.PathDown || !a.Paths[1].Since.Equal(r.clk.Now()) || !a.Paths[0].Since.Equal(ticked) {
		t.Errorf("vol-a's paths: %+v", a.Paths)
	}
	if !b.ReadAt.Equal(ticked) {
		t.Errorf("vol-b was read again: %+v", b)
	}
	if reads != 4 {
		t.Errorf("the refresh of one target read %d attribute files, want 4 (two states, two ANA states)", reads)
	}

	// A tick whose read began before the refresh commits after it: the
	// refresh's read is kept.
	r.m.deps.Model.Update(func(tx *model.Txn) {
		tx.Put(early, model.Volume{ID: "vol-a", Target: tg, Scope: model.Owned})
	})
	if a, _ := r.status("vol-a"); !a.ReadAt.Equal(r.clk.Now()) {
		t.Errorf("an older read replaced the refresh: %+v", a)
	}
}

// A volume NodeStageVolume staged between two ticks is written into the
// model at once (RefreshStaged), with the device its users hold: a kernel
// event that removes one of its controllers — which can no longer be
// read to learn its subsystem — finds its target before the next tick.
// The other targets' entries keep their reads; a record not staged yet is
// left to the tick.
func TestRefreshStaged_WritesAVolumeStagedBetweenTicks(t *testing.T) {
	r := newRigKernel(t, heal.ModeObserve, nil, func(f func()) { f() }, nvmetest.NewKernelInPlace)
	held := volume.StagedDevice{Device: volume.BlockDevice{Name: "nvme1n1", Number: volume.DeviceNumber{Major: 259, Minor: 7}}, From: "the record"}
	r.m.deps.Staged = func(recs []volume.Record) (map[string]volume.StagedDevice, error) {
		out := map[string]volume.StagedDevice{}
		for _, x := range recs {
			out[x.VolumeID] = held
		}
		return out, nil
	}
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	ctx := context.Background()
	r.m.Tick(ctx)
	ticked := r.clk.Now()

	r.clk.Step(time.Second)
	b := rec("vol-b", nqnB, "127.0.0.3", "127.0.0.4")
	r.connectAged(t, nqnB, "127.0.0.3", "127.0.0.4")
	b.State = volume.StateAttaching
	if err := r.m.RefreshStaged(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.status("vol-b"); ok {
		t.Fatal("a record still attaching was written into the model")
	}
	b.State = volume.StateStaged
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"), b)
	if err := r.m.RefreshStaged(ctx, b); err != nil {
		t.Fatal(err)
	}
	snap := r.m.deps.Model.Snapshot()
	v, ok := snap.Volume("vol-b")
	if !ok || !v.ReadAt.Equal(r.clk.Now()) || v.Held == nil || *v.Held != held {
		t.Fatalf("vol-b after RefreshStaged: %+v, %v", v, ok)
	}
	if live, _ := v.Live(); live != 2 {
		t.Errorf("vol-b's paths: %+v", v.Paths)
	}
	for _, p := range v.Paths {
		if tg, ok := snap.TargetOf(p.Object); !ok || tg != b.Target() {
			t.Errorf("TargetOf(%s) = %v, %v; want %v", p.Object, tg, ok, b.Target())
		}
	}
	if a, _ := r.status("vol-a"); !a.ReadAt.Equal(ticked) {
		t.Errorf("vol-a was read again: %+v", a)
	}
}

// A volume staged again on a new device (its old one replaced by the
// kernel): RefreshStaged writes the device its users hold now, not the
// one the last tick read, so its health is not "staged device replaced"
// once it is restaged.
func TestRefreshStaged_TheRestagedDeviceReplacesTheHeldOne(t *testing.T) {
	r := newRigKernel(t, heal.ModeObserve, nil, func(f func()) { f() }, nvmetest.NewKernelInPlace)
	var held volume.StagedDevice
	r.m.deps.Staged = func(recs []volume.Record) (map[string]volume.StagedDevice, error) {
		out := map[string]volume.StagedDevice{}
		for _, x := range recs {
			out[x.VolumeID] = held
		}
		return out, nil
	}
	a := rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2")
	a.State = volume.StateStaged
	r.set(t, a)
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	ctx := context.Background()
	held = volume.StagedDevice{Device: volume.BlockDevice{Name: "nvme9n1", Number: volume.DeviceNumber{Major: 259, Minor: 99}}, From: "the staging mount"}
	r.m.Tick(ctx)
	v, _ := r.status("vol-a")
	if v.Condition.Reason != volume.ReasonStagedDeviceReplaced {
		t.Fatalf("before the restage: %+v, want StagedDeviceReplaced", v.Condition)
	}
	// Restaged: the users now hold the namespace's current device.
	if len(v.Devices) == 0 {
		t.Fatalf("the volume has no current device: %+v", v)
	}
	held = volume.StagedDevice{Device: v.Devices[0], From: "the staging mount"}
	r.clk.Step(time.Second)
	if err := r.m.RefreshStaged(ctx, a); err != nil {
		t.Fatal(err)
	}
	v, _ = r.status("vol-a")
	if v.Held == nil || *v.Held != held || v.Condition.Reason == volume.ReasonStagedDeviceReplaced {
		t.Errorf("after RefreshStaged of the restaged volume: held %+v, condition %+v", v.Held, v.Condition)
	}
}
