package monitor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// reconnect tries to connect one missing endpoint of a volume, within
// its backoff, and returns "" when it connected, else why not (for the
// tick's report and the volume's notes).
//
// What is backed off is what costs: a probe that got no answer waited its
// whole timeout, and a kernel connect that failed after the probe
// answered may block for the connect timeout. A refusal is retried on the
// next tick. An endpoint backed off for not answering is rechecked every
// tick with a probe bounded by RecheckTimeout, which does not take a
// connect slot: when it answers again it is connected in the same tick,
// so a returned endpoint waits at most a tick, not the backoff it grew
// while it was away.
func (m *Monitor) reconnect(ctx context.Context, host *nvme.Host, n *volume.NVMeTCP, ep volume.Endpoint) (skip string) {
	key := n.NQN + " " + ep.String()
	now := m.deps.Clock.Now()
	if ok, until, lastErr, recheck := m.back.ready(key, now); !ok {
		if !recheck || !m.recheck(ctx, ep) {
			if recheck {
				m.reach.unreachable(key, now, lastErr)
			}
			return fmt.Sprintf("%s: backed off until %s (%s)", ep, until.Format(time.TimeOnly), lastErr)
		}
		klog.V(2).InfoS("Backed-off endpoint answers again; reconnecting now", "nqn", n.NQN, "endpoint", ep.String())
	}
	err := m.connect(ctx, host, n, ep)
	switch {
	case err == nil:
		m.back.success(key)
		m.reach.reachable(key)
		return ""
	case refused(err):
		m.back.success(key)
		m.reach.unreachable(key, now, err.Error())
		klog.V(2).InfoS("Path not reconnected: refused; retried next tick", "nqn", n.NQN, "endpoint", ep.String(), "err", err.Error())
		return fmt.Sprintf("%s: %v; retried next tick", ep, err)
	case errors.Is(err, errNoAnswer):
		m.reach.unreachable(key, now, err.Error())
	default:
		m.reach.reachable(key) // it answered; the connect is what failed
	}
	until := m.back.failure(key, now, err, errors.Is(err, errNoAnswer))
	klog.InfoS("Path not reconnected", "nqn", n.NQN, "endpoint", ep.String(), "err", err.Error(), "retryAt", until.Format(time.RFC3339))
	return fmt.Sprintf("%s: %v", ep, err)
}

// recheck reports whether a backed-off endpoint answers a probe bounded
// by RecheckTimeout.
func (m *Monitor) recheck(ctx context.Context, ep volume.Endpoint) bool {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.RecheckTimeout)
	defer cancel()
	return m.deps.Prober.Reachable(cctx, ep.String()) == nil
}
