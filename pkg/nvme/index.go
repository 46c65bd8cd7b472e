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

// NewIndex indexes the controllers and subsystems of h by NQN. It
// allocates a few arrays, not one slice per NQN: a monitor builds one
// every tick.
func NewIndex(h *Host) *Index {
	return &Index{
		h:          h,
		controller: group(h.Controllers, func(c *Controller) string { return c.SubsysNQN }),
		subsystem:  group(h.Subsystems, func(s *Subsystem) string { return s.NQN }),
	}
}

// group maps key(&items[i]) to the items with that key, in order, all
// slices cut from one backing array.
func group[T any](items []T, key func(*T) string) map[string][]*T {
	count := make(map[string]int, len(items))
	for i := range items {
		count[key(&items[i])]++
	}
	backing := make([]*T, len(items))
	m := make(map[string][]*T, len(count))
	for i := range items {
		k := key(&items[i])
		s, ok := m[k]
		if !ok {
			n := count[k]
			s, backing = backing[:0:n], backing[n:]
		}
		m[k] = append(s, &items[i])
	}
	return m
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

// Unplaced is Unplaced(x.Host(), nqn).
func (x *Index) Unplaced(nqn string) []*Controller {
	var out []*Controller
	for _, c := range x.controller[nqn] {
		if unplaced(c) {
			out = append(out, c)
		}
	}
	return out
}

// Covered is Covered(x.Host(), nqn, ep). It allocates nothing.
func (x *Index) Covered(nqn string, ep volume.Endpoint) bool {
	for _, c := range x.controller[nqn] {
		if presentTo(c, ep) || unplaced(c) {
			return true
		}
	}
	return false
}

// Locate is Locate(x.Host(), e).
func (x *Index) Locate(e Expectation) (Located, error) {
	return locate(x.h, e, x.subsystem[e.NQN])
}

// ReportPaths is ReportPaths(x.Host(), e).
func (x *Index) ReportPaths(e Expectation) PathReport {
	return x.ReportPathsInto(e, nil)
}

// ReportPathsInto is ReportPaths, its Endpoints appended to buf[:0]: a
// caller grading volume after volume reuses one buffer (the report's
// Endpoints are then valid until the next call with it).
func (x *Index) ReportPathsInto(e Expectation, buf []EndpointPath) PathReport {
	loc, locErr := x.Locate(e)
	return reportPaths(e, loc, locErr, x.controller[e.NQN], buf)
}

// ControllersOf returns the controllers of subsystem NQN nqn, by name.
func (x *Index) ControllersOf(nqn string) []*Controller { return x.controller[nqn] }

// SubsystemsOf returns the subsystem instances that answer NQN nqn.
func (x *Index) SubsystemsOf(nqn string) []*Subsystem { return x.subsystem[nqn] }
