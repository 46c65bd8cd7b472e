package monitor

import (
	"context"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
)

// Every path of a volume down for a long outage, ticks running: each
// path keeps the time the loop first saw it down, whatever the loop does
// meanwhile (the RPCs count fast_io_fail_tmo from it).
func TestTick_APathDownKeepsItsSinceAcrossTicks(t *testing.T) {
	for _, mode := range []heal.Mode{heal.ModeObserve, heal.ModeRepair} {
		t.Run(string(mode), func(t *testing.T) { pathDownKeepsSince(t, mode) })
	}
}

func pathDownKeepsSince(t *testing.T, mode heal.Mode) {
	r := newRigKernel(t, mode, nil, func(f func()) { f() }, nvmetest.NewKernelInPlace)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	ctx := context.Background()
	r.m.Tick(ctx) // both live: the loop learns their addresses
	r.clk.Step(time.Second)
	r.k.SetState(0, "connecting")
	r.k.SetState(1, "connecting")
	r.m.Tick(ctx)
	r.clk.Step(time.Second)
	r.m.Tick(ctx)
	st, _ := r.status("vol-a")
	if len(st.Paths) != 2 || st.Paths[0].State != model.PathDown {
		t.Fatalf("paths after the controllers began reconnecting: %+v", st.Paths)
	}
	first := st.Paths[0].Since
	for i := range 60 {
		r.clk.Step(time.Second)
		r.m.Tick(ctx)
		st, ok := r.status("vol-a")
		if !ok {
			t.Fatalf("tick %d: no entry of vol-a", i)
		}
		for _, p := range st.Paths {
			if p.State != model.PathDown || !p.Since.Equal(first) {
				t.Fatalf("tick %d (%s after the first): path %+v, want down since the first tick %s (calls %v)", i, r.clk.Now().Sub(first), p, first, r.k.Calls())
			}
		}
	}
}
