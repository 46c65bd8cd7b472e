package monitor

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// changed is a "change nvme" event of controller ctrl, as the kernel
// sends it after a reconnect: it adds and removes nothing, so the class
// listings the NVMe transport keeps stay kept.
func changed(r *rig, ctrl string) uevent.Batch {
	return uevent.Batch{Events: []uevent.Event{{Seq: 900, Action: uevent.Change, Subsystem: "nvme",
		DevPath: "/devices/virtual/nvme-fabrics/ctl/" + ctrl, Env: map[string]string{"NVME_EVENT": "connected"}, Received: r.clk.Now()}}}
}

// The kept class listings never decide: the kernel deletes a controller
// of vol-a and connects its endpoint again, and the loop has not been
// told (those events are still on their way), so the listings the
// transport kept are stale. An event naming vol-a's other controller is
// decided on a read that finds the path there (the new controller, whose
// timeouts are then aligned): nothing connects, the model names what the
// kernel has. Then the kernel deletes it
// again, still untold: the next decision finds the path missing and
// reconnects it — stale listings hid nothing and showed nothing gone.
func TestEvents_AStaleKeptListingDecidesNothing(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	ctx := context.Background()
	if rep := r.m.HandleEvents(ctx, changed(r, "nvme0")); len(rep.Decisions) != 1 || rep.Decisions[0].Started {
		t.Fatalf("healthy: %q", decisionWords(rep))
	}

	if err := r.k.Disconnect("nvme1"); err != nil {
		t.Fatal(err)
	}
	res, err := r.k.Connect(ctx, fabricsOpts(nqnA, "127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	ctrl := fmt.Sprintf("nvme%d", res.Instance)
	r.k.TakeUevents() // not yet handed to the loop
	before := len(r.k.Calls())
	rep := r.m.HandleEvents(ctx, changed(r, "nvme0"))
	// The read found the new controller: its timeouts are aligned (a
	// job that writes them), no endpoint is missing, nothing connects.
	if len(rep.Decisions) == 0 || !strings.HasSuffix(rep.Decisions[0].Words, "timeouts to align") || strings.Contains(strings.Join(decisionWords(rep), " "), "missing") {
		t.Fatalf("after an untold reconnect: %q", decisionWords(rep))
	}
	for _, c := range r.callsSince(before) {
		if strings.HasPrefix(c, "connect") {
			t.Errorf("calls: %v", r.callsSince(before))
		}
	}
	v, _ := r.status("vol-a")
	objects := map[string]bool{}
	for _, p := range v.Paths {
		objects[p.Object] = p.State == model.PathLive
	}
	if !objects[ctrl] || !objects["nvme0"] {
		t.Errorf("vol-a's paths %+v; want nvme0 and %s live", v.Paths, ctrl)
	}

	if err := r.k.Disconnect(ctrl); err != nil {
		t.Fatal(err)
	}
	r.k.TakeUevents()
	before = len(r.k.Calls())
	rep = r.m.HandleEvents(ctx, changed(r, "nvme0"))
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Started || !strings.Contains(rep.Decisions[0].Words, "missing paths: 127.0.0.2:4420") {
		t.Fatalf("after an untold delete: %q", decisionWords(rep))
	}
	if calls := r.callsSince(before); len(calls) != 1 || calls[0] != "connect 127.0.0.2:4420" {
		t.Errorf("calls: %v", calls)
	}
}

// An event naming another driver's subsystem is decided on without a
// read, and without listing the records while none was written or
// removed since a listing (the tick's) found none of it. A volume
// staged on that subsystem writes its record: the next event lists the
// records again and finds it owned.
func TestEvents_AnUnrecordedTargetIsNotListedAgain(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	healthyTwoTargets(t, r)
	const nqnC = "nqn.2014-08.io.other:c"
	r.k.AddTarget(target(nqnC, "127.0.0.5"))
	res, err := r.k.Connect(context.Background(), fabricsOpts(nqnC, "127.0.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	r.k.TakeUevents()
	scans := &countingIntents{Intents: r.m.deps.Intents}
	r.m.deps.Intents = scans
	ctrl := fmt.Sprintf("nvme%d", res.Instance)
	ctx := context.Background()
	for i := range 2 {
		rep := r.m.HandleEvents(ctx, changed(r, ctrl))
		if len(rep.Decisions) != 1 || rep.Decisions[0].Read || rep.Decisions[0].Words != "no job: not a target of the loop's scope" {
			t.Fatalf("event %d: %q", i, decisionWords(rep))
		}
	}
	targetA := volume.Target{Transport: volume.TransportNVMeTCP, Name: nqnA}
	targetC := volume.Target{Transport: volume.TransportNVMeTCP, Name: nqnC}
	// The tick's listing, begun at the records' generation of now,
	// answers: no listing of its own.
	if r.m.ev.recordedGen != r.owner.Generation() || r.m.ev.recorded[targetC] || !r.m.ev.recorded[targetA] {
		t.Errorf("the tick's listing (generation %d, now %d): %v", r.m.ev.recordedGen, r.owner.Generation(), r.m.ev.recorded)
	}
	if scans.scans != 0 {
		t.Errorf("listed again: %d listings", scans.scans)
	}

	// A record of the subsystem written (the first step of a NodeStage,
	// before the model knows the volume): the next event lists again.
	c := rec("vol-c", nqnC, "127.0.0.5")
	c.State = volume.StateStaged
	if err := r.store.Put(c); err != nil {
		t.Fatal(err)
	}
	rep := r.m.HandleEvents(ctx, changed(r, ctrl))
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Read {
		t.Fatalf("after vol-c's record was written: %q", decisionWords(rep))
	}
	if scans.scans != 1 {
		t.Errorf("after vol-c's record was written: %d listings, want 1", scans.scans)
	}
	r.m.Tick(ctx)
	if r.m.ev.recordedGen != r.owner.Generation() || !r.m.ev.recorded[targetC] {
		t.Errorf("after the tick: %v", r.m.ev.recorded)
	}
}

// countingIntents counts the listings of the records.
type countingIntents struct {
	Intents
	scans int
}

func (c *countingIntents) Scan() (volume.Listing, error) {
	c.scans++
	return c.Intents.Scan()
}
