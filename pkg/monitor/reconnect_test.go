package monitor

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// outageProber answers probes of one endpoint as the scenario says:
// "refused" (the port is closed: a reset at once), "silent" (packets
// dropped: no answer within the probe's time) or "up". Every other
// endpoint is up. It counts full probes (bounded by the connect timeout)
// and rechecks (bounded by the short recheck timeout) of that endpoint.
type outageProber struct {
	endpoint string

	mu               sync.Mutex
	state            string
	probes, rechecks int
}

func (p *outageProber) set(state string) { p.mu.Lock(); p.state = state; p.mu.Unlock() }

func (p *outageProber) counts() (probes, rechecks int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probes, p.rechecks
}

func (p *outageProber) Reachable(ctx context.Context, hostport string) error {
	if hostport != p.endpoint {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := ctx.Deadline(); ok && time.Until(d) < time.Second {
		p.rechecks++
	} else {
		p.probes++
	}
	switch p.state {
	case "refused":
		return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	case "silent":
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}
	return nil
}

// An endpoint away for a minute (its controller deleted by the kernel) is
// reconnected on the first tick after it answers again — whether it was
// refusing connections (never backed off: every tick probes it, a reset
// costs one round trip) or dropping them (full attempts backed off, a
// short recheck every tick). The monitor interval is 1 s.
func TestTick_AReturnedEndpointIsReconnectedOnTheNextTick(t *testing.T) {
	for _, tc := range []struct {
		outage string
		// maxProbes bounds the full probes during the minute away.
		maxProbes, minRechecks int
	}{
		{outage: "refused", maxProbes: 60, minRechecks: 0},
		// Backoff 3 s doubling, capped at 1 min: full attempts at 0, 3,
		// 9, 21 and 45 s; the other ticks recheck.
		{outage: "silent", maxProbes: 5, minRechecks: 50},
	} {
		t.Run(tc.outage, func(t *testing.T) {
			const ep = "127.0.0.2:4420"
			p := &outageProber{endpoint: ep, state: tc.outage}
			r := newRig(t, heal.ModeRepair, p)
			r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
			r.connectAged(t, nqnA, "127.0.0.1")
			r.k.SetUnreachable(ep, true)
			for range 60 {
				r.m.Tick(context.Background())
				r.clk.Step(time.Second)
			}
			probes, rechecks := p.counts()
			if tc.outage == "refused" && probes != 60 {
				t.Errorf("refused for 60 ticks: %d full probes, want one per tick (never backed off)", probes)
			}
			if probes > tc.maxProbes || rechecks < tc.minRechecks {
				t.Errorf("away for 60 ticks: %d full probes (want ≤ %d), %d rechecks (want ≥ %d)", probes, tc.maxProbes, rechecks, tc.minRechecks)
			}
			if calls := r.k.Calls(); contains(calls, "connect "+ep) {
				t.Fatalf("a connect to an endpoint that never answered its probe: %v", calls)
			}

			p.set("up")
			r.k.SetUnreachable(ep, false)
			rep := r.m.Tick(context.Background())
			if !contains(rep.Connects, nqnA+" "+ep) {
				t.Fatalf("first tick after the endpoint answers again: connects %v, skipped %v", rep.Connects, rep.Skipped)
			}
			if st, _ := r.status("vol-a"); func() int { l, _ := st.Live(); return l }() != 2 {
				t.Errorf("status after the reconnect = %+v", st)
			}
		})
	}
}

// The endpoints a tick could not reconnect because they did not answer
// are the node's NVMe storage conditions: EndpointsUnreachable (degraded)
// while others of the target answer, TargetUnreachable when none does,
// and nothing once they answer and are connected again.
func TestNodeConditions_UnreachableEndpoints(t *testing.T) {
	p := &outageProber{endpoint: "127.0.0.2:4420", state: "refused"}
	r := newRig(t, heal.ModeRepair, p)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1")
	r.m.Tick(context.Background())
	cs := r.m.deps.Model.Snapshot().Node()
	if len(cs) != 1 || cs[0].Status != volume.Degraded || cs[0].Reason != nvmeheal.ReasonEndpointsUnreachable ||
		!strings.Contains(cs[0].Message, "1 of 2 endpoints") || !strings.Contains(cs[0].Message, "127.0.0.2:4420 refused") {
		t.Fatalf("one endpoint refused: %+v", cs)
	}
	// The other endpoint goes silent too: its controller is gone.
	r.k.Disconnect("nvme0")
	p2 := &outageProber{endpoint: "127.0.0.1:4420", state: "silent"}
	r.prober = proberFunc(func(ctx context.Context, hp string) error {
		if err := p2.Reachable(ctx, hp); err != nil {
			return err
		}
		return p.Reachable(ctx, hp)
	})
	r.clk.Step(time.Second)
	r.m.Tick(context.Background())
	cs = r.m.deps.Model.Snapshot().Node()
	if len(cs) != 1 || cs[0].Status != volume.Inaccessible || cs[0].Reason != nvmeheal.ReasonTargetUnreachable || !strings.Contains(cs[0].Message, "2 of 2 endpoints") {
		t.Fatalf("both endpoints down: %+v", cs)
	}
	p.set("up")
	p2.set("up")
	r.clk.Step(time.Second)
	r.m.Tick(context.Background())
	if cs := r.m.deps.Model.Snapshot().Node(); len(cs) != 0 {
		t.Errorf("after both answered again: %+v", cs)
	}
}
