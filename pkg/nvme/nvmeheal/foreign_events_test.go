package nvmeheal_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// TestForeign_AGivenUpControllerIsSeenWhenTheKernelRemovesIt: companion
// mode gets the kernel's events in its foreign scope. The kernel gives up
// a controller of another driver (ctrl_loss_tmo ran out; the tick saw it
// connecting) and announces its removal: companion learns it given up at
// once, from a read of that subsystem alone, and connects it again when
// the port answers — with no tick. A controller the driver disconnects
// while it is live is announced the same way and is forgotten, never
// connected again.
func TestForeign_AGivenUpControllerIsSeenWhenTheKernelRemovesIt(t *testing.T) {
	r := newRig(t, heal.ModeRepair, companion.Actions{NVMeReconnect: true})
	r.attach(t, nqnF)
	r.tick()
	r.k.SetUnreachable("127.0.0.2:4420", true)
	r.tick() // connecting
	r.k.Announce()
	r.k.GiveUp("127.0.0.2:4420")
	evs := r.k.TakeUevents()
	r.k.SetUnreachable("127.0.0.2:4420", false) // the port answers again
	r.k.TakeUevents()
	before := len(r.k.Calls())
	if len(evs) == 0 || evs[0].Action != "remove" {
		t.Fatalf("announced: %v", evs)
	}
	rep := r.m.HandleEvents(context.Background(), batch(r, evs))
	if diff := cmp.Diff([]string{"connect 127.0.0.2:4420"}, r.callsSince(before)); diff != "" {
		t.Fatalf("calls (-want +got):\n%s\ndecisions: %+v", diff, rep.Decisions)
	}
	if len(rep.Decisions) == 0 || !rep.Decisions[0].Started || !strings.Contains(rep.Decisions[0].Words, "to connect again") {
		t.Errorf("decisions: %+v", rep.Decisions)
	}

	// The driver disconnects the live path: a disconnect, forgotten.
	r.k.TakeUevents()
	if addr, _ := r.k.FS().ReadAttr("class/nvme/nvme0/address"); !strings.Contains(addr, "traddr=127.0.0.1,") {
		t.Fatalf("nvme0 goes to %q", addr)
	}
	if err := r.k.Disconnect("nvme0"); err != nil {
		t.Fatal(err)
	}
	before = len(r.k.Calls())
	rep = r.m.HandleEvents(context.Background(), batch(r, r.k.TakeUevents()))
	for _, d := range rep.Decisions {
		if d.Started {
			t.Errorf("a disconnected endpoint acted on: %+v", d)
		}
	}
	if len(r.callsSince(before)) != 0 {
		t.Errorf("calls after the driver's disconnect: %v", r.callsSince(before))
	}
	sub, _ := r.learner.Subsystem(nqnF)
	for _, e := range sub.Endpoints {
		if e.Traddr == "127.0.0.1" {
			t.Errorf("the disconnected endpoint is still learned: %+v", e)
		}
	}
}

// batch is events as the source hands them over, received now.
func batch(r *rig, evs []uevent.Event) uevent.Batch {
	for i := range evs {
		evs[i].Received = r.clk.Now()
	}
	return uevent.Batch{Events: evs}
}
