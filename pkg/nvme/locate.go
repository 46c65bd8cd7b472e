package nvme

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Errors of Locate. Both are "not yet" answers while a volume attaches.
var (
	// ErrSubsystemNotConnected: no subsystem instance answers the NQN.
	ErrSubsystemNotConnected = errors.New("subsystem not connected")
	// ErrNamespaceNotFound: the subsystem is connected but exports no
	// namespace with the volume's identity.
	ErrNamespaceNotFound = errors.New("namespace not found")
)

// Located is the namespace of a volume in one Host snapshot.
type Located struct {
	Subsystem *Subsystem
	Namespace *Namespace
	// Device is the block device a workload uses: the multipath head, or
	// with multipath off the disk of the first live path.
	Device DeviceName
}

// Locate finds the namespace of e in h by NQN and identity (nsid, nguid,
// uuid: every given field must match). When two subsystem instances answer
// the NQN (AmbiguousHead), the one whose namespace has a usable path wins,
// so a lookup never returns the stale instance's device.
func Locate(h *Host, e Expectation) (Located, error) {
	var subs []*Subsystem
	for i := range h.Subsystems {
		if h.Subsystems[i].NQN == e.NQN {
			subs = append(subs, &h.Subsystems[i])
		}
	}
	return locate(h, e, subs)
}

// locate is Locate over subs, the subsystem instances of h that answer
// e's NQN, in instance order.
func locate(h *Host, e Expectation, subs []*Subsystem) (Located, error) {
	var candidates []Located
	connected := false
	for _, s := range subs {
		connected = true
		for j := range s.Namespaces {
			ns := &s.Namespaces[j]
			if e.matchIdentity(ns) != idMatches {
				continue
			}
			candidates = append(candidates, Located{Subsystem: s, Namespace: ns, Device: deviceOf(h, ns)})
		}
	}
	switch {
	case !connected:
		return Located{}, fmt.Errorf("%w: %s", ErrSubsystemNotConnected, e.NQN)
	case len(candidates) == 0:
		return Located{}, fmt.Errorf("%w: %s in %s", ErrNamespaceNotFound, e.describe(), e.NQN)
	}
	for _, c := range candidates {
		if c.Device != "" && usablePaths(h, c.Namespace) > 0 {
			return c, nil
		}
	}
	return candidates[0], nil
}

// deviceOf is the block device of a namespace: its head, or with
// multipath off the disk of its first live path.
func deviceOf(h *Host, ns *Namespace) DeviceName {
	if ns.Head != "" {
		return ns.Head
	}
	for _, p := range ns.Paths {
		if c, ok := h.Controller(p.Controller); ok && c.State == StateLive {
			return p.Device
		}
	}
	return ""
}

// usablePaths counts the legs of ns whose controller is live and whose ANA
// state carries I/O.
func usablePaths(h *Host, ns *Namespace) int {
	n := 0
	for _, p := range ns.Paths {
		if c, ok := h.Controller(p.Controller); ok && c.State == StateLive && p.ANAState.Usable() {
			n++
		}
	}
	return n
}

// ControllersTo returns the controllers of subsystem NQN nqn to endpoint
// ep that still count as present: any state but deleting or dead, so a
// controller the kernel is reconnecting is never connected twice.
func ControllersTo(h *Host, nqn string, ep volume.Endpoint) []*Controller {
	var out []*Controller
	for i := range h.Controllers {
		if c := &h.Controllers[i]; c.SubsysNQN == nqn && presentTo(c, ep) {
			out = append(out, c)
		}
	}
	return out
}

// presentTo reports whether c counts as a present controller to ep. A
// controller whose address is unknown goes to no endpoint known; see
// Unplaced.
func presentTo(c *Controller, ep volume.Endpoint) bool {
	return present(c) && !c.AddressUnknown && EndpointMatches(c.Address, ep)
}

// present reports whether c still counts as a path the kernel keeps:
// any state but deleting or dead.
func present(c *Controller) bool {
	return !c.State.Deleting() && c.State != StateDead
}

// Unplaced returns the controllers of subsystem NQN nqn that still count
// as present and whose address is unknown (Controller.AddressUnknown):
// each may be the kernel reconnecting any endpoint of nqn.
func Unplaced(h *Host, nqn string) []*Controller {
	var out []*Controller
	for i := range h.Controllers {
		if c := &h.Controllers[i]; c.SubsysNQN == nqn && unplaced(c) {
			out = append(out, c)
		}
	}
	return out
}

func unplaced(c *Controller) bool { return c.AddressUnknown && present(c) }

// Covered reports whether endpoint ep of nqn must not be connected now:
// a present controller goes to it, or one whose address is unknown may
// (connecting it could make a second controller to one endpoint; the
// unknown one's address is read once it is live).
func Covered(h *Host, nqn string, ep volume.Endpoint) bool {
	return len(ControllersTo(h, nqn, ep)) > 0 || len(Unplaced(h, nqn)) > 0
}

// EndpointMatches reports whether a controller address goes to ep: equal
// IPs (any notation) or equal host names, and the same port.
func EndpointMatches(a Address, ep volume.Endpoint) bool {
	var port [5]byte // uint16: at most five digits, on the stack
	if a.Trsvcid != string(strconv.AppendUint(port[:0], uint64(ep.Port), 10)) {
		return false
	}
	if ip, eip := net.ParseIP(a.Traddr), net.ParseIP(ep.Host); ip != nil && eip != nil {
		return ip.Equal(eip)
	}
	return a.Traddr == ep.Host
}

// PathReport is how a volume's expected paths look in one snapshot.
type PathReport struct {
	// Expected is the number of endpoints the volume lists.
	Expected int
	// Live counts expected endpoints with a live controller whose leg to
	// the namespace carries I/O.
	Live int
	// Optimized counts those whose leg is ANA optimized.
	Optimized int
	// Problems describe each expected path that is not live, e.g.
	// "127.0.0.1:4421: nvme4 connecting" or "127.0.0.1:4421: not connected".
	Problems []string
	// Endpoints grade each expected endpoint, in the order the volume
	// lists them.
	Endpoints []EndpointPath
}

// EndpointPath is how one expected endpoint of a volume looks.
type EndpointPath struct {
	Endpoint volume.Endpoint
	// Controller is the controller that serves it (the live one when one
	// is, else the last one looked at); empty when none does.
	Controller ControllerName
	// Live: a live controller whose leg to the namespace carries I/O;
	// Optimized: that leg is ANA optimized (or has no ANA state).
	Live, Optimized bool
	// Problem says why it is not live, without the endpoint ("nvme4
	// connecting", "not connected"); empty when live.
	Problem string
}

// ReportPaths grades every expected endpoint of e in h.
func ReportPaths(h *Host, e Expectation) PathReport {
	loc, locErr := Locate(h, e)
	ctrls := make([]*Controller, 0, len(h.Controllers))
	for i := range h.Controllers {
		if h.Controllers[i].SubsysNQN == e.NQN {
			ctrls = append(ctrls, &h.Controllers[i])
		}
	}
	return reportPaths(e, loc, locErr, ctrls, nil)
}

// reportPaths is ReportPaths given e's location and the controllers of
// its subsystem NQN; it appends the endpoints' grades to eps[:0]. A
// controller of unknown address is never a live path (the address of a
// live controller is read).
func reportPaths(e Expectation, loc Located, locErr error, ctrls []*Controller, eps []EndpointPath) PathReport {
	if eps == nil {
		eps = make([]EndpointPath, 0, len(e.Endpoints))
	}
	r := PathReport{Expected: len(e.Endpoints), Endpoints: eps[:0]}
	unknown := 0
	for _, c := range ctrls {
		if unplaced(c) {
			unknown++
		}
	}
	for _, ep := range e.Endpoints {
		p := EndpointPath{Endpoint: ep}
		to := 0
		for _, c := range ctrls {
			if presentTo(c, ep) {
				to++
			}
		}
		switch {
		case to == 0 && unknown > 0:
			var names []string
			for _, c := range ctrls {
				if unplaced(c) {
					names = append(names, string(c.Name)+" "+string(c.State))
				}
			}
			p.Problem = "not connected, or by " + strings.Join(names, ", ") + ": " + AddressNotKnown
		case to == 0:
			p.Problem = "not connected"
		}
		for _, c := range ctrls {
			if !presentTo(c, ep) {
				continue
			}
			p.Controller = c.Name
			if locErr != nil {
				p.Problem = fmt.Sprintf("%s %s, %v", c.Name, c.State, locErr)
				continue
			}
			leg, ok := legOf(loc.Namespace, c.Name)
			switch {
			case c.State != StateLive:
				p.Problem = fmt.Sprintf("%s %s", c.Name, c.State)
			case !ok:
				p.Problem = fmt.Sprintf("%s contributes no path", c.Name)
			case !leg.ANAState.Usable():
				p.Problem = fmt.Sprintf("%s ANA %s", c.Name, leg.ANAState)
			default:
				p.Problem, p.Live = "", true
				r.Live++
				if leg.ANAState == ANAOptimized || leg.ANAState == ANANone {
					p.Optimized = true
					r.Optimized++
				}
			}
			if p.Problem == "" {
				break
			}
		}
		if p.Problem != "" {
			r.Problems = append(r.Problems, ep.String()+": "+p.Problem)
		}
		r.Endpoints = append(r.Endpoints, p)
	}
	return r
}

func legOf(ns *Namespace, ctrl ControllerName) (Path, bool) {
	for _, p := range ns.Paths {
		if p.Controller == ctrl {
			return p, true
		}
	}
	return Path{}, false
}
