package monitor

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// jobResult is what one target job did, read by a later tick.
type jobResult struct {
	target   volume.Target
	intents  []intent.Verdict
	outcomes []heal.Outcome
	connects []string
	skipped  []string
	notes    map[string][]string
}

// job is the work on one target with its lease. It re-reads the target's
// records and sysfs under the lease and decides again: interrupted
// intents first, then repair, then the missing paths of staged volumes
// (optimized first), then the timeouts of their controllers. A volume that is attaching is protected as a
// co-tenant but not reconnected (its NodeStage does that); one that is
// detaching or gone is never reconnected. While a record that may be the
// target's cannot be read, every teardown is refused with that reason.
func (m *Monitor) job(ctx context.Context, lease *intent.Lease) {
	res := jobResult{target: lease.Target(), notes: map[string][]string{}}
	defer func() {
		m.mu.Lock()
		m.done = append(m.done, res)
		m.mu.Unlock()
	}()
	if m.deps.Reconciler != nil {
		res.intents = m.deps.Reconciler.Reconcile(ctx, lease)
	}
	if res.target.Transport != volume.TransportNVMeTCP || m.deps.Policy.Mode() == heal.ModeOff {
		return
	}
	ls, err := lease.Listing()
	if err != nil {
		klog.ErrorS(err, "Cannot read the records of a target; leaving it alone this tick", "target", res.target.String())
		return
	}
	var exps []nvme.Expectation
	var staged []volume.Record
	for _, r := range ls.Records {
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			exps = append(exps, e)
			if r.State == volume.StateStaged {
				staged = append(staged, r)
			}
		}
	}
	if len(exps) == 0 {
		return // unstaged since the tick planned
	}
	host, err := m.nvme.Read()
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; leaving the target alone this tick", "target", res.target.String())
		return
	}
	idx := nvme.NewIndex(host)

	// 1. heal
	var defects []heal.Defect
	for _, d := range nvme.Inspect(host, exps) {
		if defectNQN(host, d) == res.target.Name {
			defects = append(defects, d)
		}
	}
	if err := (volume.CoTenants{Unreadable: ls.Unreadable}).Err(); err != nil {
		for i := range defects {
			defects[i].Blocked = err.Error()
		}
	}
	repairer := &nvme.Repairer{Detacher: m.deps.Connector, Rescanner: m.deps.Connector, SysFS: m.deps.SysFS, Expectations: exps, Clock: m.deps.Clock}
	res.outcomes = m.deps.Policy.Heal(ctx, defects, repairer)
	for _, o := range res.outcomes {
		for _, e := range exps {
			if nvme.Concerns(host, o.Defect, e) {
				res.notes[e.VolumeID] = append(res.notes[e.VolumeID], fmt.Sprintf("%s %s: %s", o.Defect.Kind, verdictWord(o.Verdict), o.Reason))
			}
		}
	}

	// 2. subtract: a controller just deleted must not count as present,
	// or its endpoint is not reconnected and the repair bought nothing.
	removed := map[nvme.ControllerName]bool{}
	for _, o := range res.outcomes {
		for _, p := range o.Removed {
			removed[nvme.ControllerName(p.Name)] = true
		}
	}

	// 3, 4. reconcile optimized, then non-optimized, per staged volume in
	// volume ID order.
	byID := map[string]volume.Record{}
	var stagedExps []nvme.Expectation
	for _, r := range staged {
		byID[r.VolumeID] = r
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			stagedExps = append(stagedExps, e)
		}
	}
	for _, r := range staged {
		n := r.Context.NVMe
		opt, others := nvme.OrderedEndpoints(n)
		for _, group := range [][]volume.Endpoint{opt, others} {
			c, s := m.reconcile(ctx, idx, removed, n, group)
			res.connects = append(res.connects, c...)
			res.skipped = append(res.skipped, s...)
			for _, x := range s {
				res.notes[r.VolumeID] = append(res.notes[r.VolumeID], "reconnect "+x)
			}
		}
	}

	// 5. align the staged volumes' controller timeouts, on a fresh read
	// when this job changed the controllers.
	if len(res.connects) > 0 || len(removed) > 0 {
		if h, err := m.nvme.Read(); err == nil {
			host = h
		}
	}
	m.alignTimeouts(host, res.target.Name, stagedExps, byID)
}

// reconcile connects every endpoint of group that has no present
// controller. Present is any state but deleting or dead, minus what this
// job removed: a controller the kernel is reconnecting is left to it, and
// one whose address is unknown (never seen live) may be reconnecting any
// endpoint of the target, so none is connected while it is there. An
// endpoint another volume of the target listed already was connected by
// then and counts as present on the kernel's next read; the connect
// answers "already connected" otherwise.
func (m *Monitor) reconcile(ctx context.Context, idx *nvme.Index, removed map[nvme.ControllerName]bool, n *volume.NVMeTCP, group []volume.Endpoint) (connected, skipped []string) {
	for _, ep := range group {
		present := false
		for _, c := range append(idx.ControllersTo(n.NQN, ep), idx.Unplaced(n.NQN)...) {
			if !removed[c.Name] {
				present = true
			}
		}
		if present {
			continue
		}
		if m.deps.Policy.Mode() != heal.ModeRepair {
			skipped = append(skipped, fmt.Sprintf("%s: %s mode: would reconnect", ep, m.deps.Policy.Mode()))
			continue
		}
		if skip := m.reconnect(ctx, idx.Host(), n, ep); skip != "" {
			skipped = append(skipped, skip)
			continue
		}
		connected = append(connected, n.NQN+" "+ep.String())
	}
	return connected, skipped
}

// connect probes the endpoint, then connects it within ConnectTimeout.
// Secrets for DH-HMAC-CHAP come from a live sibling controller's sysfs
// attributes: records never hold secrets, and the kernel keeps the ones
// NodeStage gave it. A probe that is refused wraps ECONNREFUSED; one that
// got no answer wraps errNoAnswer.
func (m *Monitor) connect(ctx context.Context, host *nvme.Host, n *volume.NVMeTCP, ep volume.Endpoint) error {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout)
	defer cancel()
	if err := m.deps.Prober.Reachable(cctx, ep.String()); err != nil {
		if refused(err) {
			return fmt.Errorf("refused: %w", err)
		}
		return fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	secrets := nvme.SiblingSecrets(m.deps.SysFS, host, n.NQN)
	_, err := m.deps.Connector.Connect(cctx, nvme.ConnectOptions(n, ep, m.deps.Host, secrets))
	if err == nil {
		klog.InfoS("Reconnected path", "nqn", n.NQN, "endpoint", ep.String())
	}
	return err
}
