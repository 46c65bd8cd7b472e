package nvme

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
)

// namespaceMissing reports the staged volumes on s's NQN whose namespace
// s does not export while it exports others. A namespace counts as absent
// only when every exported namespace positively contradicts the volume's
// identity; if any namespace publishes none of the fields the volume
// gives, nothing is reported. At least one controller must be live, so
// that the namespace list is the result of a completed scan.
func (in *inspection) namespaceMissing(s *Subsystem) (heal.Defect, bool) {
	if len(s.Namespaces) == 0 || !in.anyLive(s) {
		return heal.Defect{}, false
	}
	var miss []*Expectation
	for _, e := range in.want[s.NQN] {
		missing := true
		for i := range s.Namespaces {
			if e.matchIdentity(&s.Namespaces[i]) != idDiffers {
				missing = false
				break
			}
		}
		if missing {
			miss = append(miss, e)
		}
	}
	if len(miss) == 0 {
		return heal.Defect{}, false
	}
	vols := make([]string, len(miss))
	needs := make([]string, len(miss))
	for i, e := range miss {
		vols[i] = e.VolumeID
		needs[i] = "volume " + e.VolumeID + " needs " + e.describe()
	}
	exported := make([]string, len(s.Namespaces))
	for i := range s.Namespaces {
		exported[i] = strconv.FormatUint(uint64(s.Namespaces[i].NSID), 10)
	}
	subject := s.NQN + " " + miss[0].describe()
	if len(miss) > 1 {
		subject = fmt.Sprintf("%s: %d namespaces", s.NQN, len(miss))
	}
	return heal.Defect{
		Kind:      heal.NamespaceMissing,
		Scope:     heal.ScopeSubsystem,
		Subject:   subject,
		Key:       s.NQN,
		Teardown:  in.teardown(s, s.Controllers, nil),
		CoTenants: in.coTenants(s, s.Controllers, nil),
		Volumes:   uniqueSorted(vols),
		Detail:    strings.Join(needs, "; ") + "; " + string(s.Name) + " exports nsid " + strings.Join(exported, ", "),
	}, true
}

// controllerDefect applies the controller-scope rules to c, a member of s,
// and returns at most one defect: StaleEndpoint when the kernel gave up on
// c (state dead) or when staged volumes on s's NQN exist and none lists
// c's endpoint; otherwise ControllerNotContributing when c is live, s
// exports namespaces and c has no leg to at least one of them that
// another controller has a leg to. A
// controller that is recovering, being deleted or in a state this package
// does not know yields nothing beyond the unlisted-endpoint rule.
func (in *inspection) controllerDefect(s *Subsystem, c *Controller) (heal.Defect, bool) {
	// The kernel is already removing a deleting controller, and a state
	// this package does not know is no evidence of anything.
	if c == nil || c.State.Deleting() || !c.State.Known() {
		return heal.Defect{}, false
	}
	// The defect's strings are built only for a controller that has one:
	// a healthy tick inspects thousands that do not.
	defect := func(kind heal.Kind, detail string, lacking []*Namespace) heal.Defect {
		gone := []ControllerName{c.Name}
		// The key outlives the controller (cooldown): its endpoint, or
		// its name while that is not known.
		key := s.NQN + " " + c.EndpointText()
		if c.AddressUnknown {
			key = s.NQN + " " + string(c.Name)
		}
		return heal.Defect{
			Kind:      kind,
			Scope:     heal.ScopeController,
			Subject:   string(c.Name) + " (" + c.EndpointText() + ")",
			Key:       key,
			Volumes:   in.volumes(s.NQN),
			Detail:    detail,
			Teardown:  in.teardown(s, gone, lacking),
			CoTenants: in.coTenants(s, gone, lacking),
		}
	}
	if c.State == StateDead {
		return defect(heal.StaleEndpoint, fmt.Sprintf("%s of %s is dead: the kernel gave up on it", c.Name, s.Name), nil), true
	}
	// A controller whose address is unknown may go to any endpoint, a
	// listed one included: it is no stale endpoint, and not being live
	// it is not one that fails to contribute either.
	if c.AddressUnknown {
		return heal.Defect{}, false
	}
	if addr, unlisted := in.unlisted(s.NQN, c); unlisted {
		return defect(heal.StaleEndpoint, fmt.Sprintf("%s of %s (%s) goes to %s, which no staged volume of %s lists", c.Name, s.Name, c.State, addr, s.NQN), nil), true
	}
	// Only a live controller has finished its namespace scan; one that
	// is reconnecting keeps its legs or gets them when it is live again.
	if c.State != StateLive || len(s.Namespaces) == 0 {
		return heal.Defect{}, false
	}
	var lacking []*Namespace
	var names []string
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		// A namespace no controller has a leg to is no evidence against
		// this one: the kernel removes a namespace's legs before its head
		// (the head outlives them by a fraction of a second when the
		// namespace goes away), and every live controller would "lack"
		// it at once. Only a namespace another controller reaches is one
		// c fails to contribute to.
		if len(ns.Paths) == 0 {
			continue
		}
		if !ns.hasPathVia(c.Name) {
			lacking = append(lacking, ns)
			names = append(names, fmt.Sprintf("%s (nsid %d)", nsDevice(ns), ns.NSID))
		}
	}
	if len(lacking) == 0 {
		return heal.Defect{}, false
	}
	return defect(heal.ControllerNotContributing, fmt.Sprintf("live controller %s of %s has no path to %s", c.Name, s.Name, strings.Join(names, ", ")), lacking), true
}

// unlisted reports whether staged volumes on nqn exist, every one of them
// can be compared with c's address without name resolution, and none
// lists it. addr is c's address for the detail.
func (in *inspection) unlisted(nqn string, c *Controller) (addr string, unlisted bool) {
	want := in.want[nqn]
	if len(want) == 0 {
		return "", false
	}
	for _, e := range want {
		listed, known := e.lists(c.Address)
		if listed || !known {
			return "", false
		}
	}
	return net.JoinHostPort(c.Address.Traddr, c.Address.Trsvcid), true
}

// hasPathVia reports whether the namespace has a leg through ctrl.
func (n *Namespace) hasPathVia(ctrl ControllerName) bool {
	for _, p := range n.Paths {
		if p.Controller == ctrl {
			return true
		}
	}
	return false
}

// nsDevice names a namespace by its head, or by "nsid N" without one.
func nsDevice(ns *Namespace) string {
	if ns.Head != "" {
		return string(ns.Head)
	}
	return nsLabel(ns)
}

// liveCount counts the live member controllers of s.
func liveCount(in *inspection, s *Subsystem) string {
	n := 0
	for _, name := range s.Controllers {
		if c := in.ctrl[name]; c != nil && c.State == StateLive {
			n++
		}
	}
	return strconv.Itoa(n)
}

// plural renders "1 controller", "2 controllers".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// uniqueSorted returns a sorted copy of s without repeats.
func uniqueSorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
