package nvme

import (
	"errors"
	"slices"
)

// PeekTarget reads, as ReadTarget does, the objects of the subsystem NQN
// nqn, without listing class/nvme and class/nvme-subsystem when the
// Reader kept their listings: it opens the instances it knows as nqn's
// and reads their directories afresh (the member controllers they link,
// their heads), then the controllers it knows as nqn's, the members the
// subsystem links and every listed object whose NQN it does not know
// yet. Every object it reports was opened and read by this call; what
// the kept listings save is finding objects that appeared since.
//
// Listings are kept from the last Read or ReadTarget (which list both
// directories) until Forget: a caller that hears of the kernel adding or
// removing a controller or a subsystem instance, or that may have missed
// hearing of it (events lost), calls Forget, and the next PeekTarget lists
// again. A PeekTarget that finds the kept picture untrue — no instance
// known as nqn's, one of them gone or another object under its name, a
// known controller gone — reads as ReadTarget does, and lists again.
//
// kept reports that the Host came from kept listings: it holds every
// object of nqn the Reader knew of, read now, and those the subsystem's
// own directory links, but could miss one that appeared since the
// listing and that nothing links yet (a second instance of the NQN). A
// caller that would act on something missing confirms it with
// ReadTarget first.
func (r *Reader) PeekTarget(nqn string) (h *Host, kept bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.kept {
		h, err := r.readTarget(nqn)
		return h, false, err
	}
	r.pass++
	p := &pass{r: r, fs: r.attrs.FS(), attrs: r.attrs, root: r.attrs.OpenRoot(), want: nqn}
	h, ok, err := p.peek(nqn)
	p.root.Close()
	if err != nil {
		r.forget()
		return nil, false, err
	}
	if !ok {
		h, err := r.readTarget(nqn)
		return h, false, err
	}
	return h, true, nil
}

// Forget drops the class listings the Reader kept: the next PeekTarget
// lists class/nvme and class/nvme-subsystem again.
func (r *Reader) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget()
}

func (r *Reader) forget() { r.kept, r.byNQN = false, nil }

// listed keeps the class listings a pass just read.
func (r *Reader) listed() { r.kept, r.byNQN = true, nil }

// classIndex is the kept class listings sorted by the NQN the Reader
// knows of each object; the names whose NQN it does not know yet (never
// read far enough, or a controller still being set up) are kept apart
// and read by every PeekTarget.
type classIndex struct {
	subs     map[string][]SubsystemName
	ctrls    map[string][]ControllerName
	newSubs  []SubsystemName
	newCtrls []ControllerName
}

// index returns the index of the kept listings, building it on first use.
func (r *Reader) index() *classIndex {
	if r.byNQN != nil {
		return r.byNQN
	}
	ix := &classIndex{subs: map[string][]SubsystemName{}, ctrls: map[string][]ControllerName{}}
	for _, n := range r.subsysClass.kept {
		name := SubsystemName(n)
		if m := r.subsystems[name]; m != nil && m.static {
			ix.subs[m.nqn] = append(ix.subs[m.nqn], name)
		} else {
			ix.newSubs = append(ix.newSubs, name)
		}
	}
	for _, n := range r.ctrlClass.kept {
		name := ControllerName(n)
		if m := r.controllers[name]; m != nil && m.static {
			ix.ctrls[m.subsysNQN] = append(ix.ctrls[m.subsysNQN], name)
		} else {
			ix.newCtrls = append(ix.newCtrls, name)
		}
	}
	r.byNQN = ix
	return ix
}

// peek is one PeekTarget from the kept listings; ok is false when what it
// found says they are not true any more (the caller reads again with
// listings, and this pass's result is dropped).
func (p *pass) peek(nqn string) (h *Host, ok bool, err error) {
	ix := p.r.index()
	known := ix.subs[nqn]
	if len(known) == 0 {
		// Whether nqn has an instance is what the listing would say.
		return nil, false, nil
	}
	h = &Host{Scope: p.r.scope, Subsystems: []Subsystem{}, Controllers: []Controller{}}
	members := map[ControllerName]SubsystemName{}
	learned := false
	for _, name := range append(slices.Clip(known), ix.newSubs...) {
		s, err := p.subsystem(name)
		if p.moved {
			return nil, false, nil
		}
		switch {
		case errors.Is(err, errVanished):
			// Never known as anything: a listed name gone before its
			// first read. (A known one gone set moved.)
			p.skip(classSubsystem+"/"+string(name), name, errVanished.Error())
			continue
		case errors.Is(err, errOtherTarget):
			learned = true
			continue
		case err != nil:
			return nil, false, err
		}
		if !slices.Contains(known, name) {
			learned = true
		}
		h.Subsystems = append(h.Subsystems, s)
		for _, c := range s.Controllers {
			members[c] = s.Name
		}
	}
	sortByInstance(h.Subsystems, func(s Subsystem) (int, string) { return s.Name.Instance(), string(s.Name) })

	names := make([]ControllerName, 0, len(members)+len(ix.ctrls[nqn])+len(ix.newCtrls))
	for c := range members {
		names = append(names, c)
	}
	names = append(names, ix.ctrls[nqn]...)
	names = append(names, ix.newCtrls...)
	// In the order of the class listing (Dir.Names: by name), as a
	// listed read takes them: without multipath, the first disk of a
	// namespace describes it.
	slices.Sort(names)
	names = slices.Compact(names)
	for _, name := range names {
		sub, member := members[name]
		m := p.r.controllers[name]
		if !member && m != nil && m.static && m.subsysNQN != nqn {
			continue // another subsystem's, as the Reader remembers it
		}
		wasNew := m == nil || !m.static
		c, devs, err := p.controller(name, sub)
		if p.moved {
			return nil, false, nil
		}
		if errors.Is(err, errVanished) {
			p.skip(classNVMe+"/"+string(name), sub, errVanished.Error())
			continue
		}
		if err != nil {
			return nil, false, err
		}
		if wasNew && p.r.controllers[name].static {
			learned = true
		}
		if c.SubsysNQN != nqn {
			continue
		}
		h.Controllers = append(h.Controllers, c)
		if !member {
			if len(devs) > 0 {
				p.skip(classNVMe+"/"+string(name), "", "controller no subsystem lists")
			}
			continue
		}
		i := slices.IndexFunc(h.Subsystems, func(s Subsystem) bool { return s.Name == sub })
		p.attach(&h.Subsystems[i], &c, devs)
	}
	if learned {
		// An object's NQN read for the first time: sorted again on the
		// next use.
		p.r.byNQN = nil
	}
	sortHost(h)
	h.Skipped = p.skipped
	h.Skipped = TargetOf(h, nqn).Skipped
	return h, true, nil
}
