package nvme

import "github.com/pathmend/pathmend/pkg/volume"

// Index answers the per-volume questions of a monitor tick about one Host
// by NQN lookups instead of scans: on a node of n volumes the package
// functions ControllersTo and ReportPaths scan every controller for each
// endpoint, which makes a tick quadratic in n. An Index's answers equal
// theirs on the same Host. It is built once per Host, never changes and
// is safe for concurrent use.
type Index struct {
	h          *Host
	controller map[string][]*Controller
	subsystem  map[string][]*Subsystem
}

// NewIndex indexes the controllers and subsystems of h by NQN.
func NewIndex(h *Host) *Index {
	x := &Index{h: h, controller: map[string][]*Controller{}, subsystem: map[string][]*Subsystem{}}
	for i := range h.Controllers {
		c := &h.Controllers[i]
		x.controller[c.SubsysNQN] = append(x.controller[c.SubsysNQN], c)
	}
	for i := range h.Subsystems {
		s := &h.Subsystems[i]
		x.subsystem[s.NQN] = append(x.subsystem[s.NQN], s)
	}
	return x
}

// Host is the Host indexed.
func (x *Index) Host() *Host { return x.h }

// ControllersTo is ControllersTo(x.Host(), nqn, ep).
func (x *Index) ControllersTo(nqn string, ep volume.Endpoint) []*Controller {
	var out []*Controller
	for _, c := range x.controller[nqn] {
		if presentTo(c, ep) {
			out = append(out, c)
		}
	}
	return out
}

// Locate is Locate(x.Host(), e).
func (x *Index) Locate(e Expectation) (Located, error) {
	return locate(x.h, e, func(yield func(*Subsystem) bool) {
		for _, s := range x.subsystem[e.NQN] {
			if !yield(s) {
				return
			}
		}
	})
}

// ReportPaths is ReportPaths(x.Host(), e).
func (x *Index) ReportPaths(e Expectation) PathReport {
	loc, locErr := x.Locate(e)
	return reportPaths(e, loc, locErr, func(ep volume.Endpoint) []*Controller { return x.ControllersTo(e.NQN, ep) })
}
