package companion

import (
	"slices"
	"time"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
)

// LearnedVersion is the version of the learned-subsystem files this
// pathmend writes and the newest it reads.
const LearnedVersion = 1

// Subsystem is what companion mode learned of one NVMe subsystem another
// driver connected: every endpoint it has seen a controller on, with the
// connect options the kernel published for it. It is the file
// <state-dir>/learned/sub-<hash>.json.
type Subsystem struct {
	Version int `json:"version"`
	// NQN is the subsystem NQN.
	NQN string `json:"nqn"`
	// Endpoints in endpoint order (Endpoint.String).
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one learned path: the fabric endpoint, the options to
// connect it again, and what pathmend last saw of its controller.
type Endpoint struct {
	nvme.Endpoint
	// HostNQN, CtrlLossTmo, ReconnectDelay, FastIOFailTmo and KATO are
	// the controller's class/nvme/<ctrl>/{hostnqn,ctrl_loss_tmo,
	// reconnect_delay,fast_io_fail_tmo,kato}.
	HostNQN        string       `json:"hostnqn"`
	CtrlLossTmo    nvme.Timeout `json:"ctrlLossTmo"`
	ReconnectDelay nvme.Timeout `json:"reconnectDelay"`
	FastIOFailTmo  nvme.Timeout `json:"fastIOFailTmo"`
	KATO           int          `json:"kato"`
	// Params are hostid, queue_count, sqsize and whether the kernel
	// held a DH-HMAC-CHAP key (never the key).
	Params nvme.ConnectParams `json:"params"`

	// Controller is the controller last seen on the endpoint.
	Controller nvme.ControllerName `json:"controller"`
	// LastState is the last state seen other than deleting, deleting (no
	// IO) and dead: what the controller was doing before it vanished.
	LastState nvme.ControllerState `json:"lastState"`
	// FirstSeen is when pathmend first saw a controller on the endpoint.
	FirstSeen time.Time `json:"firstSeen"`
	// GoneSince is when pathmend first saw no controller on the
	// endpoint; zero while one is present.
	GoneSince time.Time `json:"goneSince,omitzero"`
	// TornDown is set when a companion repair deleted the controller:
	// pathmend took the path away, so pathmend connects it again.
	TornDown bool `json:"tornDown,omitempty"`
}

// GivenUp reports whether the endpoint's controller vanished while the
// kernel was reconnecting it (its ctrl_loss_tmo ran out).
func (e *Endpoint) GivenUp() bool {
	return !e.GoneSince.IsZero() && (e.LastState == nvme.StateConnecting || e.LastState == nvme.StateResetting)
}

// WantsConnect reports whether companion mode connects the endpoint again:
// it has no controller, and the kernel gave it up or a repair tore it
// down.
func (e *Endpoint) WantsConnect() bool {
	return !e.GoneSince.IsZero() && (e.TornDown || e.GivenUp())
}

// Options are the fabrics connect options of the endpoint, as learned.
// Secrets are not learned: the caller adds the ones a live controller of
// the subsystem still holds.
func (e *Endpoint) Options(nqn string) fabrics.Options {
	o := fabrics.Options{
		Transport: e.Transport, Traddr: e.Traddr, Trsvcid: e.Trsvcid, NQN: nqn,
		HostNQN: e.HostNQN, HostID: e.Params.HostID, HostTraddr: e.HostTraddr, HostIface: e.HostIface,
		CtrlLossTmo:    timeoutOption(e.CtrlLossTmo),
		ReconnectDelay: timeoutOption(e.ReconnectDelay),
		FastIOFailTmo:  timeoutOption(e.FastIOFailTmo),
	}
	if e.KATO > 0 {
		o.KeepAliveTmo = new(e.KATO)
	}
	// queue_count counts the admin queue; sqsize is 0's based.
	if e.Params.QueueCount > 1 {
		o.NrIOQueues = new(e.Params.QueueCount - 1)
	}
	if e.Params.SQSize > 0 {
		o.QueueSize = new(e.Params.SQSize + 1)
	}
	return o
}

// timeoutOption is a learned timeout as a connect option: "off" is -1,
// which the kernel reads as "forever" (ctrl_loss_tmo) or "off"
// (fast_io_fail_tmo). reconnect_delay is never off.
func timeoutOption(t nvme.Timeout) *int {
	if t.Off {
		return new(-1)
	}
	return new(t.Seconds)
}

// endpoint returns the learned endpoint ep, or nil.
func (s *Subsystem) endpoint(ep nvme.Endpoint) *Endpoint {
	for i := range s.Endpoints {
		if s.Endpoints[i].Endpoint == ep {
			return &s.Endpoints[i]
		}
	}
	return nil
}

// sortEndpoints orders the endpoints by their string form.
func (s *Subsystem) sortEndpoints() {
	slices.SortFunc(s.Endpoints, func(a, b Endpoint) int {
		switch as, bs := a.String(), b.String(); {
		case as < bs:
			return -1
		case as > bs:
			return 1
		}
		return 0
	})
}

// clone copies s deeply enough that changing the copy's endpoints leaves
// s alone.
func (s Subsystem) clone() Subsystem {
	s.Endpoints = slices.Clone(s.Endpoints)
	return s
}
