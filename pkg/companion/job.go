package companion

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/nvme"
)

// jobResult is what one subsystem's job did, read by a later tick.
type jobResult struct {
	nqn      string
	outcomes []heal.Outcome
	connects []string
	skipped  []string
}

// errNoSecret: the endpoint was connected with DH-HMAC-CHAP and no live
// controller of the subsystem holds the keys any more.
var errNoSecret = errors.New("the endpoint authenticated with DH-HMAC-CHAP and no controller of the subsystem holds the keys any more (pathmend never stores them)")

// job works on one subsystem with its lease: it re-reads the node
// plugin's records of the target (a record that appeared since the tick
// planned makes the target the plugin's: nothing is done), re-reads
// sysfs, repairs through the policy, and connects again the endpoints
// the kernel gave up and those the repair tore down.
func (n *NVMe) job(ctx context.Context, lease *intent.Lease) {
	nqn := lease.Target().Name
	res := jobResult{nqn: nqn}
	defer func() {
		n.resMu.Lock()
		n.done = append(n.done, res)
		n.resMu.Unlock()
	}()
	ls, err := lease.Listing()
	if err != nil {
		res.skipped = append(res.skipped, nqn+": cannot read the staged-volume records: "+err.Error())
		return
	}
	if len(ls.Records) > 0 || len(ls.Unreadable) > 0 {
		why := ownerOf(ls).why()
		res.skipped = append(res.skipped, nqn+": "+string(heal.ClassOwnedByNodePlugin)+": "+why)
		if n.gate.Should("owned "+nqn, why) {
			klog.InfoS("Companion leaves a subsystem to the node plugin", "nqn", nqn, "reason", why)
		}
		return
	}
	host, err := n.reader.Read()
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; leaving the subsystem alone this tick", "nqn", nqn)
		return
	}
	var defects []heal.Defect
	for _, d := range nvme.Inspect(host, nil) {
		if defectNQN(host, d) == nqn {
			strand(host, &d)
			defects = append(defects, d)
		}
	}
	res.outcomes = n.heal(ctx, defects)
	removed := map[nvme.ControllerName]bool{}
	torn := map[string]bool{}
	for _, o := range res.outcomes {
		for _, p := range o.Removed {
			removed[nvme.ControllerName(p.Name)] = true
			if c, ok := host.Controller(nvme.ControllerName(p.Name)); ok && !c.AddressUnknown {
				torn[c.Endpoint().String()] = true
			}
		}
	}
	eps := n.markTornDown(nqn, torn)
	for _, e := range eps {
		if !e.WantsConnect() && !torn[e.String()] {
			continue
		}
		present := slices.ContainsFunc(host.Controllers, func(c nvme.Controller) bool {
			return c.SubsysNQN == nqn && goesTo(&c, e.Endpoint) && !c.State.Deleting() && !removed[c.Name]
		})
		if present {
			continue
		}
		s, ok := n.reconnect(ctx, host, nqn, e)
		if ok {
			res.connects = append(res.connects, nqn+" "+e.String())
			n.gate.Forget("reconnect " + nqn + " " + e.String())
			continue
		}
		res.skipped = append(res.skipped, nqn+" "+e.String()+": "+s)
		// An observed or disabled reconnect, once per change (a failed one
		// has its own line): it would otherwise repeat every tick.
		if strings.Contains(s, "would reconnect") && n.gate.Should("reconnect "+nqn+" "+e.String(), s) {
			klog.InfoS("Learned path not reconnected", "nqn", nqn, "endpoint", e.String(), "reason", s)
		}
	}
}

// heal runs the policy on the defects: Heal when teardown repairs are
// enabled (or in observe mode, where Heal only reports), else a dry run
// whose allowed repairs come back Observed with class action_disabled.
func (n *NVMe) heal(ctx context.Context, defects []heal.Defect) []heal.Outcome {
	if len(defects) == 0 {
		return nil
	}
	p := n.deps.Policy
	if n.cfg.Actions.NVMeRepairs || p.Mode() != heal.ModeRepair {
		repairer := &nvme.Repairer{Detacher: n.deps.Connector, Rescanner: n.deps.Connector, SysFS: n.deps.SysFS, Clock: n.deps.Clock}
		return p.Heal(ctx, defects, repairer)
	}
	outs := p.Plan(defects)
	for i := range outs {
		o := &outs[i]
		if o.Class == heal.ClassObserveMode {
			o.Class, o.Reason = heal.ClassActionDisabled, o.Reason+"; NVMe teardown repairs are not enabled (--nvme-repairs)"
		}
		if n.gate.Should("defect "+o.Defect.Key, string(o.Verdict)+o.Reason) {
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

// markTornDown marks the learned endpoints a repair tore down, so a
// later tick connects them again even if this job's connect fails, and
// returns the subsystem's endpoints.
func (n *NVMe) markTornDown(nqn string, torn map[string]bool) []Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub, ok := n.learned[nqn]
	if !ok {
		return nil
	}
	if len(torn) > 0 {
		sub = sub.clone()
		for i := range sub.Endpoints {
			if torn[sub.Endpoints[i].String()] {
				sub.Endpoints[i].TornDown = true
			}
		}
		n.learned[nqn] = sub
		n.persist([]string{nqn}, nil)
	}
	return slices.Clone(sub.Endpoints)
}

// reconnect connects endpoint e of nqn with its learned options, if the
// mode and the action flags allow it and its backoff has run out; skip
// says why not, or why it failed.
func (n *NVMe) reconnect(ctx context.Context, host *nvme.Host, nqn string, e Endpoint) (skip string, ok bool) {
	flag, enabled := "--nvme-reconnect", n.cfg.Actions.NVMeReconnect
	if e.TornDown || !e.GivenUp() {
		flag, enabled = "--nvme-repairs", n.cfg.Actions.NVMeRepairs
	}
	switch {
	case n.deps.Policy.Mode() != heal.ModeRepair:
		return fmt.Sprintf("%s mode: would reconnect with the learned options", n.deps.Policy.Mode()), false
	case !enabled:
		return "would reconnect with the learned options; not enabled (" + flag + ")", false
	}
	key := nqn + " " + e.String()
	now := n.deps.Clock.Now()
	if ok, until, lastErr := n.ready(key, now); !ok {
		return fmt.Sprintf("backed off until %s (%s)", until.Format(time.TimeOnly), lastErr), false
	}
	name, err := n.connect(ctx, host, nqn, e)
	if err != nil {
		until := n.failed(key, now, err)
		klog.InfoS("Path not reconnected", "nqn", nqn, "endpoint", e.String(), "learned", true, "err", err.Error(), "retryAt", until.Format(time.RFC3339))
		return err.Error(), false
	}
	n.succeeded(key)
	n.markReconnected(nqn, e.Endpoint, name)
	return "", true
}

// markReconnected records that endpoint ep of nqn has a live controller
// again, name, which the connect just created: the kernel answers a
// connect once the controller is live. Without it the endpoint would stay
// given up until a tick read the new controller, and a controller someone
// disconnected before that tick would read as given up again, and be
// connected again, instead of as a disconnect.
func (n *NVMe) markReconnected(nqn string, ep nvme.Endpoint, name nvme.ControllerName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub, ok := n.learned[nqn]
	if !ok {
		return
	}
	sub = sub.clone()
	e := sub.endpoint(ep)
	if e == nil {
		return
	}
	e.Controller, e.GoneSince, e.TornDown, e.LastState = name, time.Time{}, false, nvme.StateLive
	n.learned[nqn] = sub
	n.persist([]string{nqn}, nil)
	if n.connected == nil {
		n.connected = map[string]uint64{}
	}
	n.connected[nqn+" "+ep.String()] = n.reads
}

// connect probes the endpoint, then connects it within ConnectTimeout.
func (n *NVMe) connect(ctx context.Context, host *nvme.Host, nqn string, e Endpoint) (nvme.ControllerName, error) {
	cctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
	defer cancel()
	if err := n.deps.Prober.Reachable(cctx, net.JoinHostPort(e.Traddr, e.Trsvcid)); err != nil {
		return "", fmt.Errorf("unreachable: %w", err)
	}
	o := e.Options(nqn)
	if e.Params.DHCHAP {
		s := nvme.SiblingSecrets(n.deps.SysFS, host, nqn)
		if s.DHCHAPSecret == "" {
			return "", errNoSecret
		}
		o.DHCHAPSecret, o.DHCHAPCtrlSecret = s.DHCHAPSecret, s.DHCHAPCtrlSecret
	}
	r, err := n.deps.Connector.Connect(cctx, o)
	if err != nil {
		return "", err
	}
	klog.InfoS("Reconnected path", "nqn", nqn, "endpoint", e.String(), "learned", true, "controller", r.Name(), "options", o.String())
	return nvme.ControllerName(r.Name()), nil
}

// strand adds to d's co-tenants every namespace of the subsystem the
// teardown would leave with no usable path, the defect's own included:
// companion mode cannot see which namespaces another driver's workloads
// use, so it treats every one as in use. A namespace is stranded when
// the teardown removes one of its legs, no usable leg remains outside
// it, and it had a usable leg before or no leg at all remains (its block
// device would disappear).
func strand(h *nvme.Host, d *heal.Defect) {
	gone := map[nvme.ControllerName]bool{}
	for _, p := range d.Teardown {
		gone[nvme.ControllerName(p.Name)] = true
	}
	listed := map[string]bool{}
	for _, c := range d.CoTenants {
		listed[c.Device] = true
	}
	usable := func(p nvme.Path) bool {
		c, ok := h.Controller(p.Controller)
		return ok && c.State == nvme.StateLive && p.ANAState.Usable()
	}
	for _, s := range h.Subsystems {
		if !slices.ContainsFunc(s.Controllers, func(c nvme.ControllerName) bool { return gone[c] }) {
			continue
		}
		for _, ns := range s.Namespaces {
			legsIn, legsOut, usableNow, usableOut := 0, 0, false, false
			for _, p := range ns.Paths {
				u := usable(p)
				usableNow = usableNow || u
				if gone[p.Controller] {
					legsIn++
				} else {
					legsOut++
					usableOut = usableOut || u
				}
			}
			if legsIn == 0 || usableOut || (!usableNow && legsOut > 0) {
				continue
			}
			for _, dev := range ns.Devices() {
				if !listed[string(dev)] {
					listed[string(dev)] = true
					d.CoTenants = append(d.CoTenants, heal.CoTenant{Namespace: fmt.Sprintf("%s nsid %d", s.Name, ns.NSID), Device: string(dev)})
				}
			}
		}
	}
}
