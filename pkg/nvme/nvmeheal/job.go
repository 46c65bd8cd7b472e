package nvmeheal

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Mend is what the repair step of the NVMe job works on: one subsystem,
// the volumes whose namespaces it must find (and spare), and what it may
// tear down.
type Mend struct {
	// NQN is the subsystem.
	NQN string
	// Expect are the volumes Inspect compares the subsystem with and the
	// repair spares: every volume of the subsystem the caller knows, in
	// any state. None in the foreign scope.
	Expect []nvme.Expectation
	// Concern, when set, keeps only the defects that concern this volume
	// (it names it, or its teardown includes a controller of its
	// subsystem), StaleEndpoint aside: what a NodeStage repairs. Without
	// it, every defect whose teardown releases a controller of NQN.
	Concern *nvme.Expectation
	// Blocked, when set, refuses every teardown with this reason (a
	// record that may be the subsystem's cannot be read).
	Blocked string
	// Foreign repairs a subsystem another driver connected: every
	// namespace counts as in use, and the teardowns run only when
	// Actions.NVMeRepairs enables them (else they are decided and
	// reported as observed, action_disabled).
	Foreign bool
}

// Mended is what the repair step did.
type Mended struct {
	// Host is the read the step decided on.
	Host     *nvme.Host
	Outcomes []heal.Outcome
	// Removed are the controllers it tore down.
	Removed map[nvme.ControllerName]bool
}

// Mend is the repair step of the NVMe job, the one code that repairs a
// subsystem: on a fresh read it diagnoses (nvme.Inspect), decides through
// the policy (heal.Policy) and tears down what the policy allows
// (nvme.Repairer). It reads the subsystem's own objects only
// (nvme.Reader.ReadTarget). The caller holds the subsystem's lease: the loop's
// job, and the NVMe attacher's repair during a NodeStage (which holds
// the lease of the one subsystem it attaches).
func (t *Transport) Mend(ctx context.Context, m Mend) (Mended, error) {
	host, err := t.reader.ReadTarget(m.NQN)
	if err != nil {
		return Mended{}, err
	}
	res := Mended{Host: host, Removed: map[nvme.ControllerName]bool{}}
	var defects []heal.Defect
	for _, d := range nvme.Inspect(host, m.Expect) {
		switch {
		case m.Concern != nil && (d.Kind == heal.StaleEndpoint || !nvme.Concerns(host, d, *m.Concern)):
			continue
		case m.Concern == nil && nvme.TeardownNQN(host, d) != m.NQN:
			continue
		}
		if m.Foreign {
			companion.Strand(host, &d)
		}
		if m.Blocked != "" {
			d.Blocked = m.Blocked
		}
		defects = append(defects, d)
	}
	res.Outcomes = t.decide(ctx, m, defects)
	for _, o := range res.Outcomes {
		for _, p := range o.Removed {
			res.Removed[nvme.ControllerName(p.Name)] = true
		}
	}
	return res, nil
}

// decide runs the policy on the defects: Heal (which in observe mode
// only reports), except in the foreign scope with the teardown repairs
// not enabled: a dry run whose allowed repairs come back Observed with
// class action_disabled.
func (t *Transport) decide(ctx context.Context, m Mend, defects []heal.Defect) []heal.Outcome {
	if len(defects) == 0 {
		return nil
	}
	p := t.deps.Policy
	if !m.Foreign || t.cfg.Actions.NVMeRepairs || p.Mode() != heal.ModeRepair {
		repairer := &nvme.Repairer{Detacher: t.deps.Connector, Rescanner: t.deps.Connector, SysFS: t.deps.SysFS, Expectations: m.Expect, Clock: t.deps.Clock}
		return p.Heal(ctx, defects, repairer)
	}
	outs := p.Plan(defects)
	for i := range outs {
		o := &outs[i]
		if o.Class == heal.ClassObserveMode {
			o.Class, o.Reason = heal.ClassActionDisabled, o.Reason+"; NVMe teardown repairs are not enabled (--nvme-repairs)"
		}
		if t.gate.Should("defect "+o.Defect.Key, string(o.Verdict)+o.Reason) {
			klog.InfoS("Heal verdict", "verdict", o.Verdict, "defect", o.Defect.Kind, "scope", o.Defect.Scope, "key", o.Defect.Key,
				"controllers", teardownNames(o.Defect), "reason", o.Reason, "mode", p.Mode())
		}
	}
	return outs
}

func teardownNames(d heal.Defect) string {
	names := make([]string, len(d.Teardown))
	for i, p := range d.Teardown {
		names[i] = p.Name
	}
	return fmt.Sprint(names)
}

// Job is the NVMe job on one subsystem, with its lease. It re-reads the
// subsystem's records under the lease and decides again from them: a
// subsystem a record names (any state, or an unreadable record that may
// be its) is the node plugin's, healed for its staged volumes; one no
// record names is a learned subsystem of the foreign scope, or nothing
// any more. So a NodeStage that wrote its attaching record after the
// tick planned a foreign job turns it into the plugin's.
func (t *Transport) Job(ctx context.Context, lease *intent.Lease) model.Result {
	tg := lease.Target()
	res := model.Result{Target: tg, Notes: map[string][]string{}}
	if t.deps.Policy.Mode() == heal.ModeOff {
		return res
	}
	ls, err := lease.Listing()
	if err != nil {
		klog.ErrorS(err, "Cannot read the records of a target; leaving it alone this tick", "target", tg.String())
		res.Skipped = append(res.Skipped, tg.Name+": cannot read the staged-volume records: "+err.Error())
		return res
	}
	if len(ls.Records) > 0 || len(ls.Unreadable) > 0 {
		if !t.cfg.Owned {
			why := companion.OwnerOf(ls).Why()
			res.Skipped = append(res.Skipped, tg.Name+": "+string(heal.ClassOwnedByNodePlugin)+": "+why)
			if t.gate.Should("owned "+tg.Name, why) {
				klog.InfoS("Companion leaves a subsystem to the node plugin", "nqn", tg.Name, "reason", why)
			}
			return res
		}
		t.ownedJob(ctx, ls, &res)
		return res
	}
	if t.cfg.Foreign != nil {
		t.foreignJob(ctx, tg.Name, &res)
	}
	return res
}

// ownedJob heals a subsystem of staged volumes: repair first, then the
// missing paths of staged volumes (optimized first), then the timeouts of
// their controllers. A volume that is attaching is protected as a
// co-tenant but not reconnected (its NodeStage does that); one that is
// detaching or gone is never reconnected. While a record that may be the
// subsystem's cannot be read, every teardown is refused with that reason.
//
// Repair comes before reconnect on purpose: a reconnect-first job would
// diagnose a controller created microseconds earlier, one that has not
// attached its namespace yet (indistinguishable from one that never
// will), tear down the path it just made and leave the volume a path
// short until a later tick.
func (t *Transport) ownedJob(ctx context.Context, ls volume.Listing, res *model.Result) {
	nqn := res.Target.Name
	exps, staged, byID := expectations(ls.Records)
	if len(exps) == 0 {
		return // unstaged since the tick planned
	}
	m := Mend{NQN: nqn, Expect: exps}
	if err := (volume.CoTenants{Unreadable: ls.Unreadable}).Err(); err != nil {
		m.Blocked = err.Error()
	}
	// 1. heal
	mended, err := t.Mend(ctx, m)
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; leaving the target alone this tick", "target", res.Target.String())
		return
	}
	host := mended.Host
	res.Outcomes = mended.Outcomes
	for _, o := range res.Outcomes {
		for _, e := range exps {
			if nvme.Concerns(host, o.Defect, e) {
				res.Notes[e.VolumeID] = append(res.Notes[e.VolumeID], fmt.Sprintf("%s %s: %s", o.Defect.Kind, verdictWord(o.Verdict), o.Reason))
			}
		}
	}
	// 2. subtract: a controller just deleted must not count as present,
	// or its endpoint is not reconnected and the repair bought nothing.
	// 3, 4. reconnect optimized, then non-optimized, per staged volume in
	// volume ID order.
	idx := nvme.NewIndex(host)
	for _, e := range staged {
		n := byID[e.VolumeID].Context.NVMe
		opt, others := nvme.OrderedEndpoints(n)
		for _, group := range [][]volume.Endpoint{opt, others} {
			c, s := t.reconcile(ctx, idx, mended.Removed, n, group)
			res.Connects = append(res.Connects, c...)
			res.Skipped = append(res.Skipped, s...)
			for _, x := range s {
				res.Notes[e.VolumeID] = append(res.Notes[e.VolumeID], "reconnect "+x)
			}
		}
	}
	res.Changed = len(res.Connects) > 0 || len(mended.Removed) > 0 || anyRepaired(res.Outcomes)
	// 5. align the staged volumes' controller timeouts, on a fresh read
	// when this job changed the controllers.
	if res.Changed {
		if h, err := t.reader.ReadTarget(nqn); err == nil {
			host = h
		}
	}
	t.alignTimeouts(host, nqn, staged, byID)
}

func anyRepaired(outs []heal.Outcome) bool {
	for _, o := range outs {
		if len(o.Removed) > 0 || o.Verdict == heal.Repaired {
			return true
		}
	}
	return false
}

func verdictWord(v heal.Verdict) string {
	if v == heal.Deferred {
		return "repair deferred"
	}
	return string(v)
}

// reconcile connects every endpoint of group that has no present
// controller. Present is any state but deleting or dead, minus what this
// job removed: a controller the kernel is reconnecting is left to it, and
// one whose address is unknown (never seen live) may be reconnecting any
// endpoint of the target, so none is connected while it is there. An
// endpoint another volume of the target listed already was connected by
// then and counts as present on the kernel's next read; the connect
// answers "already connected" otherwise.
func (t *Transport) reconcile(ctx context.Context, idx *nvme.Index, removed map[nvme.ControllerName]bool, n *volume.NVMeTCP, group []volume.Endpoint) (connected, skipped []string) {
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
		if t.deps.Policy.Mode() != heal.ModeRepair {
			skipped = append(skipped, fmt.Sprintf("%s: %s mode: would reconnect", ep, t.deps.Policy.Mode()))
			continue
		}
		if skip := t.reconnect(ctx, idx.Host(), n, ep); skip != "" {
			skipped = append(skipped, skip)
			continue
		}
		connected = append(connected, n.NQN+" "+ep.String())
	}
	return connected, skipped
}

// foreignJob heals a learned subsystem no record names: it repairs
// through the policy (every namespace in use), marks what the repair tore
// down, and connects again the endpoints the kernel gave up and those the
// repair tore down, with the learned options.
func (t *Transport) foreignJob(ctx context.Context, nqn string, res *model.Result) {
	if _, ok := t.cfg.Foreign.Subsystem(nqn); !ok {
		return // forgotten since the tick planned
	}
	mended, err := t.Mend(ctx, Mend{NQN: nqn, Foreign: true})
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; leaving the subsystem alone this tick", "nqn", nqn)
		return
	}
	host := mended.Host
	res.Outcomes = mended.Outcomes
	torn := map[string]bool{}
	for name := range mended.Removed {
		if c, ok := host.Controller(name); ok && !c.AddressUnknown {
			torn[c.Endpoint().String()] = true
		}
	}
	for _, e := range t.cfg.Foreign.MarkTornDown(nqn, torn) {
		if !e.WantsConnect() && !torn[e.String()] {
			continue
		}
		present := slices.ContainsFunc(host.Controllers, func(c nvme.Controller) bool {
			return c.SubsysNQN == nqn && companion.GoesTo(&c, e.Endpoint) && !c.State.Deleting() && !mended.Removed[c.Name]
		})
		if present {
			continue
		}
		s, ok := t.reconnectLearned(ctx, host, nqn, e)
		if ok {
			res.Connects = append(res.Connects, nqn+" "+e.String())
			t.gate.Forget("reconnect " + nqn + " " + e.String())
			continue
		}
		res.Skipped = append(res.Skipped, nqn+" "+e.String()+": "+s)
		// An observed or disabled reconnect, once per change (a failed one
		// has its own line): it would otherwise repeat every tick.
		if strings.Contains(s, "would reconnect") && t.gate.Should("reconnect "+nqn+" "+e.String(), s) {
			klog.InfoS("Learned path not reconnected", "nqn", nqn, "endpoint", e.String(), "reason", s)
		}
	}
	res.Changed = len(res.Connects) > 0 || len(mended.Removed) > 0
}
