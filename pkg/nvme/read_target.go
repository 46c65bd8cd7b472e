package nvme

import (
	"errors"
	"slices"
)

// ReadTarget reads, as Read does, only what belongs to the subsystem NQN
// nqn: the subsystem instances that answer it, with their heads, and the
// controllers whose subsysnqn it is, with their legs. Its Host equals
// TargetOf(r.Read(), nqn) at that moment; it is what answering for one
// volume costs (its subsystem's objects), not a read of the node.
//
// It lists the two class directories (to see objects appear) and reads
// the attributes of nqn's objects only. Which objects those are comes
// from what the Reader remembers — an object's NQN is fixed for its life
// — and from the kernel's own links: the member controllers a subsystem
// directory lists. An object the Reader has not seen yet (a new name) is
// read far enough to learn its NQN. When none of the instances the Reader
// remembers for nqn is there any more (the subsystem went away and may
// have come back under a name another subsystem had), every subsystem is
// looked at again, as Read does. It forgets nothing: only Read prunes.
func (r *Reader) ReadTarget(nqn string) (*Host, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.readTarget(nqn)
}

// readTarget is ReadTarget with r.mu held: the class listings are read
// again, and kept.
func (r *Reader) readTarget(nqn string) (*Host, error) {
	r.pass++
	p := &pass{r: r, fs: r.attrs.FS(), attrs: r.attrs, root: r.attrs.OpenRoot(), want: nqn}
	defer p.root.Close()
	h, err := p.target(nqn)
	if err != nil {
		r.forget()
		return nil, err
	}
	r.listed()
	return h, nil
}

// TargetOf returns the part of h that belongs to the subsystem NQN nqn:
// the subsystems that answer it, the controllers whose subsysnqn it is,
// and what was skipped of them. Indexes and Inspect treat it as they
// treat h for nqn.
func TargetOf(h *Host, nqn string) *Host {
	out := &Host{Scope: h.Scope, Subsystems: []Subsystem{}, Controllers: []Controller{}}
	names := map[SubsystemName]bool{}
	for _, s := range h.Subsystems {
		if s.NQN == nqn {
			out.Subsystems = append(out.Subsystems, s)
			names[s.Name] = true
		}
	}
	paths := map[string]bool{}
	for _, c := range h.Controllers {
		if c.SubsysNQN == nqn {
			out.Controllers = append(out.Controllers, c)
			paths[classNVMe+"/"+string(c.Name)] = true
		}
	}
	for _, s := range h.Skipped {
		if names[s.Subsystem] || paths[s.Path] || s.Subsystem == "" && hasPrefixIn(s.Path, paths) {
			out.Skipped = append(out.Skipped, s)
		}
	}
	return out
}

// hasPrefixIn reports whether p is one of the paths, or below one.
func hasPrefixIn(p string, paths map[string]bool) bool {
	for q := range paths {
		if p == q || len(p) > len(q) && p[:len(q)] == q && p[len(q)] == '/' {
			return true
		}
	}
	return false
}

// target is one ReadTarget.
func (p *pass) target(nqn string) (*Host, error) {
	h := &Host{Scope: p.r.scope, Subsystems: []Subsystem{}, Controllers: []Controller{}}
	subNames, err := p.list(classSubsystem, &p.r.subsysClass, func(n string) bool { return SubsystemName(n).Instance() >= 0 })
	if err != nil {
		return nil, err
	}
	// The instances to look at: those remembered as nqn's, and the names
	// never seen; every one when a remembered instance of nqn is gone, or
	// none is remembered.
	var look []string
	remembered, gone := 0, false
	present := map[string]bool{}
	for _, n := range subNames {
		present[n] = true
	}
	for name, m := range p.r.subsystems {
		if m.static && m.nqn == nqn {
			remembered++
			if !present[string(name)] {
				gone = true
			}
		}
	}
	for _, n := range subNames {
		m := p.r.subsystems[SubsystemName(n)]
		if remembered == 0 || gone || m == nil || !m.static || m.nqn == nqn {
			look = append(look, n)
		}
	}
	members := map[ControllerName]SubsystemName{}
	for _, n := range look {
		s, err := p.subsystem(SubsystemName(n))
		if errors.Is(err, errVanished) {
			p.skip(classSubsystem+"/"+n, SubsystemName(n), errVanished.Error())
			continue
		}
		if errors.Is(err, errOtherTarget) {
			continue
		}
		if err != nil {
			return nil, err
		}
		h.Subsystems = append(h.Subsystems, s)
		for _, c := range s.Controllers {
			members[c] = s.Name
		}
	}
	sortByInstance(h.Subsystems, func(s Subsystem) (int, string) { return s.Name.Instance(), string(s.Name) })

	ctrlNames, err := p.list(classNVMe, &p.r.ctrlClass, func(n string) bool { return ControllerName(n).Instance() >= 0 })
	if err != nil {
		return nil, err
	}
	for _, n := range ctrlNames {
		name := ControllerName(n)
		sub, member := members[name]
		m := p.r.controllers[name]
		if !member && m != nil && m.static && m.subsysNQN != nqn {
			continue // another subsystem's, as the Reader remembers it
		}
		c, devs, err := p.controller(name, sub)
		if errors.Is(err, errVanished) {
			p.skip(classNVMe+"/"+n, sub, errVanished.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		if c.SubsysNQN != nqn {
			continue
		}
		h.Controllers = append(h.Controllers, c)
		if !member {
			if len(devs) > 0 {
				p.skip(classNVMe+"/"+n, "", "controller no subsystem lists")
			}
			continue
		}
		i := slices.IndexFunc(h.Subsystems, func(s Subsystem) bool { return s.Name == sub })
		p.attach(&h.Subsystems[i], &c, devs)
	}
	sortHost(h)
	// What was skipped of nqn's objects, as TargetOf keeps it of a full
	// read: another subsystem's new object looked at and gone is not
	// nqn's business.
	h.Skipped = p.skipped
	h.Skipped = TargetOf(h, nqn).Skipped
	return h, nil
}
