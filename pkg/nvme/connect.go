package nvme

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Connector is what connecting and repairing need of pkg/nvme/fabrics
// (*fabrics.Connector): connect, delete a controller, rescan one.
type Connector interface {
	Connect(ctx context.Context, o fabrics.Options) (fabrics.Result, error)
	Detacher
	Rescanner
}

// ConnectOptions builds the fabrics options of one endpoint of a volume:
// the volume context's tunables, and for the timeouts it leaves out
// pathmend's defaults (TimeoutsOf); a fast_io_fail_tmo of -1 (off) is
// the kernel's default and is not sent.
func ConnectOptions(n *volume.NVMeTCP, ep volume.Endpoint, host fabrics.HostIdentity, s volume.Secrets) fabrics.Options {
	t := TimeoutsOf(n)
	o := fabrics.Options{
		Transport: "tcp", Traddr: ep.Host, Trsvcid: fmt.Sprint(ep.Port), NQN: n.NQN,
		HostNQN: host.NQN, HostID: host.ID, HostTraddr: n.HostTraddr, HostIface: n.HostIface,
		CtrlLossTmo: &t.CtrlLossTmo, ReconnectDelay: &t.ReconnectDelay, FastIOFailTmo: n.FastIOFailTmo,
		KeepAliveTmo: n.KeepAliveTmo, NrIOQueues: n.NrIOQueues,
		DHCHAPSecret: s.DHCHAPSecret, DHCHAPCtrlSecret: s.DHCHAPCtrlSecret,
	}
	if o.FastIOFailTmo == nil && t.FastIOFailTmo >= 0 {
		o.FastIOFailTmo = &t.FastIOFailTmo
	}
	return o
}

// OrderedEndpoints lists optimized endpoints first, then the others, each
// group in the order the volume context gives.
func OrderedEndpoints(n *volume.NVMeTCP) (optimized, others []volume.Endpoint) {
	if len(n.OptimizedEndpoints) == 0 {
		return n.Endpoints, nil
	}
	opt := map[volume.Endpoint]bool{}
	for _, e := range n.OptimizedEndpoints {
		opt[e] = true
	}
	for _, e := range n.Endpoints {
		if opt[e] {
			optimized = append(optimized, e)
		} else {
			others = append(others, e)
		}
	}
	return optimized, others
}

// Concerns reports whether defect d is about the volume of exp: it names
// the volume, or its teardown includes a controller of the volume's NQN.
func Concerns(h *Host, d heal.Defect, exp Expectation) bool {
	if slices.Contains(d.Volumes, exp.VolumeID) {
		return true
	}
	for _, p := range d.Teardown {
		if c, ok := h.Controller(ControllerName(p.Name)); ok && c.SubsysNQN == exp.NQN {
			return true
		}
	}
	return false
}

// ConditionOf turns a path report into a volume condition: healthy when
// every expected path is live, inaccessible when none is, degraded
// between, with a message naming each missing path.
func ConditionOf(r PathReport) volume.Condition {
	msg := fmt.Sprintf("%d of %d paths live", r.Live, r.Expected)
	if len(r.Problems) > 0 {
		msg += "; " + strings.Join(r.Problems, "; ")
	}
	switch {
	case r.Live == 0:
		return volume.Condition{Status: volume.Inaccessible, Reason: "NoLivePath", Message: msg}
	case r.Live < r.Expected:
		return volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: msg}
	}
	return volume.Condition{Status: volume.Healthy, Message: msg}
}

// ExpectationOf is the expectation of volume volumeID with NVMe context n.
func ExpectationOf(volumeID string, n *volume.NVMeTCP) Expectation {
	return Expectation{VolumeID: volumeID, NQN: n.NQN, Endpoints: n.Endpoints, OptimizedEndpoints: n.OptimizedEndpoints, NSID: n.NSID, NGUID: n.NGUID, UUID: n.UUID}
}

// UsablePaths counts the paths of ns that carry I/O in h: a live
// controller with a usable ANA state.
func UsablePaths(h *Host, ns *Namespace) int { return usablePaths(h, ns) }

// NamespaceLabel names a namespace for messages: "nvme-subsys0 nsid 2".
func NamespaceLabel(ns *Namespace) string { return nsLabel(ns) }
