package nvmetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Change applies one kernel change drawn from r to a copy of t and
// returns the changed topology and what the change was. The changes are
// those a host sees between two monitor ticks: ANA states flipping,
// controllers changing state, reconnecting (a new cntlid and src_addr),
// getting new timeouts, dying, appearing and re-appearing under a used
// name with other attributes; namespaces added, removed, resized and
// re-created under a used head; subsystems appearing, disappearing and
// re-created; an administrator's iopolicy write; and nothing at all.
// Anything fixed for a kernel object's life changes only with a new
// object (a new Gen), as in the kernel.
func Change(r *rand.Rand, t Topology) (Topology, string) {
	t = t.Clone()
	for {
		if what, ok := changes[r.IntN(len(changes))](r, &t); ok {
			return t, what
		}
	}
}

// changes are the kinds of Change; each reports false when t offers
// nothing it could apply to.
var changes = []func(*rand.Rand, *Topology) (string, bool){
	func(*rand.Rand, *Topology) (string, bool) { return "nothing", true },
	changeANA,
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onController(r, t, func(c *Controller) string {
			c.ANAGroup = 1 + r.IntN(4)
			return "ANA group " + strconv.Itoa(c.ANAGroup)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onController(r, t, func(c *Controller) string {
			c.State = States[r.IntN(len(States))]
			return "state " + c.State
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onController(r, t, func(c *Controller) string {
			c.State, c.CntlID = "live", 1+r.IntN(200)
			c.SrcAddr = "192.0.2." + strconv.Itoa(100+r.IntN(50))
			return fmt.Sprintf("reconnected: cntlid %d, src_addr %s", c.CntlID, c.SrcAddr)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onController(r, t, func(c *Controller) string {
			c.CtrlLossTmo = pick(r, "600", "off", "30", "-1")
			c.ReconnectDelay = pick(r, "10", "2", "1")
			c.FastIOFailTmo = pick(r, "off", "5", "0")
			c.KATO = pick(r, 5, 10, 30)
			return "timeouts " + c.CtrlLossTmo + "/" + c.ReconnectDelay + "/" + c.FastIOFailTmo + "/" + strconv.Itoa(c.KATO)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onSubsystem(r, t, func(s *Subsystem) string {
			s.IOPolicy = pick(r, "numa", "round-robin", "queue-depth")
			return "iopolicy " + s.IOPolicy
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onNamespace(r, t, func(_ *Subsystem, ns *Namespace) string {
			ns.Sectors = 2048 * uint64(1+r.IntN(64))
			return "resized to " + strconv.FormatUint(ns.Sectors, 10)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onController(r, t, func(c *Controller) string {
			h := r.IntN(4) + 1
			if _, ok := c.Legs[h]; ok {
				delete(c.Legs, h)
				return "leg to head " + strconv.Itoa(h) + " dropped"
			}
			c.Legs[h] = pick(r, "optimized", "non-optimized", "inaccessible")
			return "leg to head " + strconv.Itoa(h) + " attached"
		})
	},
	controllerDies,
	controllerRecreated,
	controllerAppears,
	namespaceAdded,
	namespaceRemoved,
	namespaceRecreated,
	subsystemRecreated,
	subsystemRemoved,
	subsystemAdded,
}

func changeANA(r *rand.Rand, t *Topology) (string, bool) {
	return onController(r, t, func(c *Controller) string {
		heads := slices.Sorted(func(yield func(int) bool) {
			for h, a := range c.Legs {
				if a != NoANA && !yield(h) {
					return
				}
			}
		})
		if len(heads) == 0 {
			return ""
		}
		h := heads[r.IntN(len(heads))]
		c.Legs[h] = ANAStates[r.IntN(len(ANAStates)-1)] // not NoANA: ANA stays on
		return "leg to head " + strconv.Itoa(h) + " ANA " + c.Legs[h]
	})
}

func controllerDies(r *rand.Rand, t *Topology) (string, bool) {
	s, i, ok := randomController(r, t)
	if !ok {
		return "", false
	}
	name := s.Controllers[i].Instance
	s.Controllers = slices.Delete(s.Controllers, i, i+1)
	return "nvme" + strconv.Itoa(name) + " deleted", true
}

// controllerRecreated replaces a controller by a new one with the same
// name: another port, cntlid, host address, age and set of legs, maybe in
// another subsystem.
func controllerRecreated(r *rand.Rand, t *Topology) (string, bool) {
	s, i, ok := randomController(r, t)
	if !ok {
		return "", false
	}
	old := s.Controllers[i]
	c := newController(r, t, old.Instance)
	dst := s
	if r.IntN(3) == 0 {
		dst = &t.Subsystems[r.IntN(len(t.Subsystems))]
	}
	s.Controllers = slices.Delete(s.Controllers, i, i+1)
	attachLegs(r, dst, &c)
	dst.Controllers = append(dst.Controllers, c)
	return fmt.Sprintf("nvme%d re-created in nvme-subsys%d: port %s, cntlid %d, %d legs", c.Instance, dst.Instance, c.Trsvcid, c.CntlID, len(c.Legs)), true
}

// controllerAppears adds a controller with the lowest free instance, the
// way the kernel's ida numbers them: often the name of one deleted
// earlier.
func controllerAppears(r *rand.Rand, t *Topology) (string, bool) {
	if len(t.Subsystems) == 0 {
		return "", false
	}
	used := map[int]bool{}
	for _, s := range t.Subsystems {
		for _, c := range s.Controllers {
			used[c.Instance] = true
		}
	}
	n := 0
	for used[n] {
		n++
	}
	s := &t.Subsystems[r.IntN(len(t.Subsystems))]
	c := newController(r, t, n)
	attachLegs(r, s, &c)
	s.Controllers = append(s.Controllers, c)
	return fmt.Sprintf("nvme%d connected to nvme-subsys%d", n, s.Instance), true
}

func newController(r *rand.Rand, t *Topology, instance int) Controller {
	return Controller{
		Instance:   instance,
		Gen:        nextGen(t),
		State:      pick(r, "live", "live", "connecting", "new"),
		Traddr:     pick(r, "192.0.2.1", "192.0.2.2", "2001:db8::1"),
		Trsvcid:    strconv.Itoa(4420 + r.IntN(4)),
		HostTraddr: pick(r, "", "192.0.2.100"),
		CntlID:     1 + r.IntN(200),
		Age:        time.Duration(r.Int64N(int64(time.Minute))),
		ANAGroup:   1 + r.IntN(2),
		Legs:       map[int]string{},
	}
}

// attachLegs gives c a leg to a random subset of s's namespaces.
func attachLegs(r *rand.Rand, s *Subsystem, c *Controller) {
	for _, ns := range s.Namespaces {
		if r.IntN(4) != 0 {
			c.Legs[ns.Head] = pick(r, "optimized", "non-optimized", "inaccessible", NoANA)
		}
	}
}

func namespaceAdded(r *rand.Rand, t *Topology) (string, bool) {
	return onSubsystem(r, t, func(s *Subsystem) string {
		h := 1
		for slices.ContainsFunc(s.Namespaces, func(ns Namespace) bool { return ns.Head == h }) {
			h++
		}
		ns := newNamespace(r, t, h)
		s.Namespaces = append(s.Namespaces, ns)
		for i := range s.Controllers {
			if r.IntN(4) != 0 {
				s.Controllers[i].Legs[h] = pick(r, "optimized", "non-optimized")
			}
		}
		return fmt.Sprintf("namespace nsid %d added as head %d", ns.NSID, h)
	})
}

func namespaceRemoved(r *rand.Rand, t *Topology) (string, bool) {
	return onNamespace(r, t, func(s *Subsystem, ns *Namespace) string {
		h := ns.Head
		s.Namespaces = slices.DeleteFunc(s.Namespaces, func(n Namespace) bool { return n.Head == h })
		for i := range s.Controllers {
			delete(s.Controllers[i].Legs, h)
		}
		return "head " + strconv.Itoa(h) + " removed"
	})
}

// namespaceRecreated replaces a namespace by another one that gets the
// same head instance: other nsid, other identifiers, other size.
func namespaceRecreated(r *rand.Rand, t *Topology) (string, bool) {
	return onNamespace(r, t, func(_ *Subsystem, ns *Namespace) string {
		*ns = newNamespace(r, t, ns.Head)
		return fmt.Sprintf("head %d re-created for nsid %d", ns.Head, ns.NSID)
	})
}

func newNamespace(r *rand.Rand, t *Topology, head int) Namespace {
	ns := Namespace{Head: head, Gen: nextGen(t), NSID: uint32(1 + r.IntN(32)), Sectors: 2048 * uint64(1+r.IntN(64))}
	id := fmt.Sprintf("%08x-%04x-4000-8000-%012x", r.Uint32(), r.IntN(1<<16), r.Int64N(1<<48))
	switch r.IntN(3) {
	case 0:
		ns.UUID = id
	case 1:
		ns.NGUID = id
	}
	return ns
}

// subsystemRecreated replaces a subsystem by a new one with the same
// name: another NQN, model and serial, new controllers and namespaces.
func subsystemRecreated(r *rand.Rand, t *Topology) (string, bool) {
	return onSubsystem(r, t, func(s *Subsystem) string {
		s.Gen, s.Age = nextGen(t), 0
		s.NQN = fmt.Sprintf("nqn.2024-01.io.pathmend.test:re%d", s.Gen)
		s.Model, s.Serial = "model-"+strconv.Itoa(s.Gen), fmt.Sprintf("%020d", s.Gen)
		s.Type = pick(r, "nvm", "nvm", "discovery")
		for i := range s.Namespaces {
			head := s.Namespaces[i].Head
			s.Namespaces[i] = newNamespace(r, t, head)
		}
		for i := range s.Controllers {
			c := newController(r, t, s.Controllers[i].Instance)
			attachLegs(r, s, &c)
			s.Controllers[i] = c
		}
		return fmt.Sprintf("nvme-subsys%d re-created for %s", s.Instance, s.NQN)
	})
}

func subsystemRemoved(r *rand.Rand, t *Topology) (string, bool) {
	if len(t.Subsystems) == 0 {
		return "", false
	}
	i := r.IntN(len(t.Subsystems))
	n := t.Subsystems[i].Instance
	t.Subsystems = slices.Delete(t.Subsystems, i, i+1)
	return "nvme-subsys" + strconv.Itoa(n) + " removed with its controllers", true
}

func subsystemAdded(r *rand.Rand, t *Topology) (string, bool) {
	n := 0
	for slices.ContainsFunc(t.Subsystems, func(s Subsystem) bool { return s.Instance == n }) {
		n++
	}
	g := nextGen(t)
	t.Subsystems = append(t.Subsystems, Subsystem{Instance: n, Gen: g, NQN: fmt.Sprintf("nqn.2024-01.io.pathmend.test:new%d", g),
		Namespaces: []Namespace{newNamespace(r, t, 1)}})
	s := &t.Subsystems[len(t.Subsystems)-1]
	for range 1 + r.IntN(2) {
		c := newController(r, t, freeController(t))
		attachLegs(r, s, &c)
		s.Controllers = append(s.Controllers, c)
	}
	return fmt.Sprintf("nvme-subsys%d added with %d controllers", n, len(s.Controllers)), true
}

// freeController is the lowest controller instance no subsystem uses.
func freeController(t *Topology) int {
	n := 0
	for slices.ContainsFunc(t.Subsystems, func(s Subsystem) bool {
		return slices.ContainsFunc(s.Controllers, func(c Controller) bool { return c.Instance == n })
	}) {
		n++
	}
	return n
}

// nextGen is a Gen no object of t has.
func nextGen(t *Topology) int {
	g := 0
	for _, s := range t.Subsystems {
		g = max(g, s.Gen)
		for _, ns := range s.Namespaces {
			g = max(g, ns.Gen)
		}
		for _, c := range s.Controllers {
			g = max(g, c.Gen)
		}
	}
	return g + 1
}

func randomController(r *rand.Rand, t *Topology) (*Subsystem, int, bool) {
	var subs []int
	for i, s := range t.Subsystems {
		if len(s.Controllers) > 0 {
			subs = append(subs, i)
		}
	}
	if len(subs) == 0 {
		return nil, 0, false
	}
	s := &t.Subsystems[subs[r.IntN(len(subs))]]
	return s, r.IntN(len(s.Controllers)), true
}

func onController(r *rand.Rand, t *Topology, f func(*Controller) string) (string, bool) {
	s, i, ok := randomController(r, t)
	if !ok {
		return "", false
	}
	c := &s.Controllers[i]
	what := f(c)
	return "nvme" + strconv.Itoa(c.Instance) + ": " + what, what != ""
}

func onSubsystem(r *rand.Rand, t *Topology, f func(*Subsystem) string) (string, bool) {
	if len(t.Subsystems) == 0 {
		return "", false
	}
	s := &t.Subsystems[r.IntN(len(t.Subsystems))]
	return f(s), true
}

func onNamespace(r *rand.Rand, t *Topology, f func(*Subsystem, *Namespace) string) (string, bool) {
	var subs []int
	for i, s := range t.Subsystems {
		if len(s.Namespaces) > 0 {
			subs = append(subs, i)
		}
	}
	if len(subs) == 0 {
		return "", false
	}
	s := &t.Subsystems[subs[r.IntN(len(subs))]]
	ns := &s.Namespaces[r.IntN(len(s.Namespaces))]
	return "nvme-subsys" + strconv.Itoa(s.Instance) + ": " + f(s, ns), true
}

func pick[T any](r *rand.Rand, choices ...T) T { return choices[r.IntN(len(choices))] }
