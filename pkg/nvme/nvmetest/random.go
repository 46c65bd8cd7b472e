package nvmetest

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Limits bounds a Random topology.
type Limits struct {
	// Subsystems, Controllers (per subsystem) and Namespaces (per
	// subsystem) are upper bounds; at least one subsystem is generated.
	Subsystems, Controllers, Namespaces int
	// SharedNQN is the probability that a subsystem reuses the NQN of
	// an earlier one (two kernel instances answering one NQN).
	SharedNQN float64
}

// States are the controller states of Linux 6.1, for generators.
var States = []string{"new", "live", "resetting", "connecting", "deleting", "deleting (no IO)", "dead"}

// ANAStates are the leg states a generator picks from, NoANA included.
var ANAStates = []string{"optimized", "non-optimized", "inaccessible", "persistent-loss", "change", NoANA}

// Random returns a topology drawn from r within lim: controllers in any
// state, legs to any subset of their subsystem's namespaces in any ANA
// state, ports 4420-4423, ages up to a day, multipath on or off.
// Instance numbers are unique and not dense, as on a host that has seen
// controllers come and go.
func Random(r *rand.Rand, lim Limits) Topology {
	t := Topology{NoMultipath: r.IntN(4) == 0}
	nsubs := 1 + r.IntN(max(lim.Subsystems, 1))
	nextCtrl := r.IntN(3)
	for s := range nsubs {
		nqn := "nqn.2024-01.io.pathmend.test:r" + strconv.Itoa(s)
		if s > 0 && r.Float64() < lim.SharedNQN {
			nqn = t.Subsystems[r.IntN(s)].NQN
		}
		sub := Subsystem{Instance: 2*s + r.IntN(2), NQN: nqn}
		for h := range r.IntN(lim.Namespaces + 1) {
			sub.Namespaces = append(sub.Namespaces, Namespace{
				Head: h + 1,
				NSID: uint32(h + 1 + r.IntN(2)*10),
				UUID: fmt.Sprintf("%08x-0000-4000-8000-%012x", s, h+1),
			})
		}
		for range r.IntN(lim.Controllers + 1) {
			c := Controller{
				Instance: nextCtrl,
				State:    States[r.IntN(len(States))],
				Trsvcid:  strconv.Itoa(4420 + r.IntN(4)),
				Age:      time.Duration(r.Int64N(int64(24 * time.Hour))),
				Legs:     map[int]string{},
			}
			nextCtrl += 1 + r.IntN(2)
			for _, ns := range sub.Namespaces {
				if r.IntN(4) != 0 {
					c.Legs[ns.Head] = ANAStates[r.IntN(len(ANAStates))]
				}
			}
			sub.Controllers = append(sub.Controllers, c)
		}
		t.Subsystems = append(t.Subsystems, sub)
	}
	return t
}

// MakeHealthy returns t with every controller live and a leg from every
// controller to every namespace of its subsystem, keeping each leg's ANA
// state (a missing leg becomes non-optimized), and every subsystem
// exporting at least one namespace. NQNs are made unique.
func (t Topology) MakeHealthy() Topology {
	out := Topology{NoMultipath: t.NoMultipath}
	for i, s := range t.Subsystems {
		s.NQN = fmt.Sprintf("%s-%d", s.NQN, i)
		if len(s.Namespaces) == 0 {
			s.Namespaces = []Namespace{{Head: 1, NSID: 1}}
		}
		ctrls := make([]Controller, len(s.Controllers))
		for j, c := range s.Controllers {
			c.State = "live"
			l := make(map[int]string, len(s.Namespaces))
			for _, ns := range s.Namespaces {
				l[ns.Head] = "non-optimized"
				if a, ok := c.Legs[ns.Head]; ok {
					l[ns.Head] = a
				}
			}
			c.Legs = l
			ctrls[j] = c
		}
		s.Controllers = ctrls
		out.Subsystems = append(out.Subsystems, s)
	}
	return out
}
