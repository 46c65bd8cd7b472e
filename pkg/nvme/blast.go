package nvme

import (
	"slices"
	"strconv"

	"github.com/pathmend/pathmend/pkg/heal"
)

// usable reports whether path p of a namespace can carry I/O now: its
// controller is live and its ANA state admits I/O.
func (in *inspection) usable(p Path) bool {
	c := in.ctrl[p.Controller]
	return c != nil && c.State == StateLive && p.ANAState.Usable()
}

// hasUsablePath reports whether any namespace of s can carry I/O now.
func (in *inspection) hasUsablePath(s *Subsystem) bool {
	for i := range s.Namespaces {
		if slices.ContainsFunc(s.Namespaces[i].Paths, in.usable) {
			return true
		}
	}
	return false
}

// anyLive reports whether a member controller of s is live.
func (in *inspection) anyLive(s *Subsystem) bool {
	for _, name := range s.Controllers {
		if c := in.ctrl[name]; c != nil && c.State == StateLive {
			return true
		}
	}
	return false
}

// teardown lists the controllers a repair releases, in teardown order:
// controllers that are not live first, then live ones whose best leg to
// the namespaces in scope is unusable or absent, then non-optimized, then
// optimized (or non-ANA) ones last; ties in controller instance order.
// Access is each controller's best ANA state over the namespaces in scope
// (nil: every namespace of s), "" when it has no leg to any of them.
func (in *inspection) teardown(s *Subsystem, names []ControllerName, scope []*Namespace) []heal.Path {
	if scope == nil {
		for i := range s.Namespaces {
			scope = append(scope, &s.Namespaces[i])
		}
	}
	type ranked struct {
		path heal.Path
		tier int
		inst int
	}
	rs := make([]ranked, 0, len(names))
	for _, name := range names {
		c := in.ctrl[name]
		if c == nil {
			continue
		}
		best, hasLeg := ANAState(""), false
		for _, ns := range scope {
			for _, p := range ns.Paths {
				if p.Controller == name && (!hasLeg || p.ANAState.rank() > best.rank()) {
					best, hasLeg = p.ANAState, true
				}
			}
		}
		// Tier 0 goes first: a controller that is not live carries no
		// I/O now, so releasing it costs nothing. Then the live ones by
		// how much they contribute.
		tier := 0
		switch {
		case c.State != StateLive:
		case !hasLeg || !best.Usable():
			tier = 1
		default:
			tier = 1 + best.rank()
		}
		rs = append(rs, ranked{
			path: heal.Path{
				Name:      string(name),
				Endpoint:  c.EndpointText(),
				State:     string(c.State),
				Access:    string(best),
				CreatedAt: c.CreatedAt,
			},
			tier: tier,
			inst: name.Instance(),
		})
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		if a.tier != b.tier {
			return a.tier - b.tier
		}
		return a.inst - b.inst
	})
	out := make([]heal.Path, len(rs))
	for i, r := range rs {
		out[i] = r.path
	}
	return out
}

// coTenants lists the namespaces of s, other than the subjects of the
// defect, that releasing the controllers in gone would strand. A
// namespace is stranded when the teardown removes at least one of its
// legs, no usable leg remains through a controller outside gone, and
// either it had a usable leg before (the teardown takes its last usable
// path) or no leg at all remains (its block device disappears). Each
// block device of a stranded namespace is one CoTenant.
func (in *inspection) coTenants(s *Subsystem, gone []ControllerName, subjects []*Namespace) []heal.CoTenant {
	var out []heal.CoTenant
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		if slices.Contains(subjects, ns) {
			continue
		}
		var legsIn, legsOut int
		var usableNow, usableOut bool
		for _, p := range ns.Paths {
			u := in.usable(p)
			usableNow = usableNow || u
			if slices.Contains(gone, p.Controller) {
				legsIn++
				continue
			}
			legsOut++
			usableOut = usableOut || u
		}
		// Untouched, still usable elsewhere, or already unusable with a
		// leg left that may recover: not stranded by this teardown.
		if legsIn == 0 || usableOut || (!usableNow && legsOut > 0) {
			continue
		}
		for _, dev := range ns.Devices() {
			out = append(out, heal.CoTenant{Namespace: nsLabel(ns), Device: string(dev)})
		}
	}
	return out
}

// nsLabel names a namespace for operators: "nvme-subsys0 nsid 2".
func nsLabel(ns *Namespace) string {
	return string(ns.Subsystem) + " nsid " + strconv.FormatUint(uint64(ns.NSID), 10)
}
