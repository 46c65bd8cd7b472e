package nvme

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// subsystem reads class/nvme-subsystem/<name>: its attributes, the links
// to its member controllers and its multipath heads.
func (p *pass) subsystem(name SubsystemName) (Subsystem, error) {
	m := p.r.subsystems[name]
	if m == nil {
		m = &subsysMemo{object: object{rel: classSubsystem + "/" + string(name)}}
		p.r.subsystems[name] = m
	}
	d, same, err := p.open(&m.object)
	if err != nil {
		return Subsystem{}, err
	}
	defer d.Close()
	if !same {
		// Another subsystem than the one remembered under this name.
		*m = subsysMemo{object: m.object}
	}
	o := obj{p: p, d: d, id: d.Identity()}
	entries, err := d.Names(m.names)
	if err != nil {
		return Subsystem{}, o.vanished(err)
	}
	m.names = entries
	if !m.static {
		if err := o.text("subsysnqn", &m.nqn); err != nil {
			return Subsystem{}, err
		}
		if err := o.text("model", &m.model); err != nil {
			return Subsystem{}, err
		}
		if err := o.text("serial", &m.serial); err != nil {
			return Subsystem{}, err
		}
		if err := o.optional("subsystype", "subsystype", entries, &m.typ); err != nil {
			return Subsystem{}, err
		}
		m.static = true
	}
	if p.want != "" && m.nqn != p.want {
		return Subsystem{}, errOtherTarget
	}
	if p.r.scope == ScopeAll {
		if err := o.optional("iopolicy", "iopolicy", entries, &m.iopolicy); err != nil {
			return Subsystem{}, err
		}
	}
	if m.from == nil || !sameSlice(entries, m.from) {
		m.deriveMembers(entries)
	}
	s := Subsystem{Name: name, NQN: m.nqn, Model: m.model, Serial: m.serial, IOPolicy: m.iopolicy, Type: m.typ,
		Controllers: m.ctrls, Namespaces: []Namespace{}}
	if m.disks == nil {
		m.disks = make(map[string]*diskMemo, len(m.heads))
	}
	for _, e := range m.heads {
		ns, err := p.head(o, m, name, e)
		if errors.Is(err, errVanished) {
			p.skip(m.rel+"/"+e, name, errVanished.Error())
			continue
		}
		if err != nil {
			return Subsystem{}, err
		}
		s.Namespaces = append(s.Namespaces, ns)
	}
	maps.DeleteFunc(m.disks, func(_ string, dm *diskMemo) bool { return dm.seen != p.r.pass })
	return s, nil
}

// deriveMembers sorts a subsystem directory's entries into member
// controllers and heads. The directory holds attributes, one link per
// member controller (nvme<X>) and, with native multipath, one directory
// per head (nvme<N>n<H>). Everything else (power/, uevent, the subsystem
// class link) is not pathmend's business.
func (m *subsysMemo) deriveMembers(entries []string) {
	ctrls := []ControllerName{}
	var heads []string
	for _, e := range entries {
		if c := ControllerName(e); c.Instance() >= 0 {
			ctrls = append(ctrls, c)
			continue
		}
		if d, ok := parseDiskName(e); ok && !d.isLeg() {
			heads = append(heads, e)
		}
	}
	sortByInstance(ctrls, func(c ControllerName) (int, string) { return c.Instance(), string(c) })
	// Clipped: a Host shares the slice, and an append must copy it.
	m.ctrls, m.heads, m.from = slices.Clip(ctrls), heads, entries
	if m.from == nil {
		m.from = []string{}
	}
}

// head reads the multipath head entry of subsystem name, whose directory
// is sub.
func (p *pass) head(sub obj, m *subsysMemo, name SubsystemName, entry string) (Namespace, error) {
	dn, _ := parseDiskName(entry)
	dm := m.disks[entry]
	if dm == nil {
		dm = newDiskMemo(entry, dn)
		m.disks[entry] = dm
	}
	dm.seen = p.r.pass
	ns := Namespace{Subsystem: name, HeadInstance: dn.head, Head: DeviceName(entry)}
	o, err := p.disk(sub.d, entry, dm)
	if err == nil {
		err = p.identity(o, dm, &ns)
	}
	if err != nil {
		return Namespace{}, p.diskGone(p.root, "block/"+entry, err)
	}
	return ns, nil
}

// disk stats the directory of a head or per-controller disk below d and
// returns it as an object, forgetting dm's static attributes when the
// directory is not the one they were read from. A directory that is gone
// is errVanished.
func (p *pass) disk(d sysfs.Dir, entry string, dm *diskMemo) (obj, error) {
	id, err := d.Stat(entry)
	if sysfs.IsNotExist(err) {
		return obj{}, errVanished
	}
	if err != nil {
		return obj{}, err
	}
	if id != dm.id {
		dm.id, dm.static = id, false
	}
	return obj{p: p, d: d, sub: entry, id: id}, nil
}

// identity reads the namespace identity attributes of a head or
// per-controller disk (drivers/nvme/host/core.c, nvme_ns_id_attrs). nsid,
// wwid and size are always published; the kernel hides nguid when it is
// zero and uuid when both it and the NGUID are. The identifiers are fixed
// when the namespace's head is created; size follows a resize.
func (p *pass) identity(o obj, dm *diskMemo, ns *Namespace) error {
	if !dm.static {
		b, err := o.raw(dm.paths.nsid)
		if err != nil {
			return err
		}
		nsid, err := parseUint(string(b), 32)
		if err != nil {
			return fmt.Errorf("parse %s/%s: %w", o.d.Rel(), dm.paths.nsid, err)
		}
		dm.nsid = uint32(nsid)
		if err := o.optional(dm.paths.nguid, "", nil, &dm.nguid); err != nil {
			return err
		}
		if err := o.optional(dm.paths.uuid, "", nil, &dm.uuid); err != nil {
			return err
		}
		if err := o.text(dm.paths.wwid, &dm.wwid); err != nil {
			return err
		}
		// dev is the block device's number, fixed for its life; a tree
		// without it (a hand-made fixture) reads as unknown.
		var dev string
		if err := o.optional(dm.paths.dev, "", nil, &dev); err != nil {
			return err
		}
		dm.dev = volume.DeviceNumber{}
		if dev != "" {
			n, err := volume.ParseDeviceNumber(dev)
			if err != nil {
				return fmt.Errorf("parse %s/%s: %w", o.d.Rel(), dm.paths.dev, err)
			}
			dm.dev = n
		}
		dm.static = true
	}
	ns.NSID, ns.NGUID, ns.UUID, ns.WWID, ns.Dev = dm.nsid, dm.nguid, dm.uuid, dm.wwid, dm.dev
	if p.r.scope != ScopeAll {
		return nil
	}
	var err error
	ns.Sectors, err = parsed(o, dm.paths.size, &dm.size, parseU64)
	return err
}

// diskGone turns a missing attribute of a namespace block device into
// errVanished when witness (below d) is gone too: del_gendisk removes the
// disk's block/<disk> link, then its attribute groups, then its
// directory, so a read in between finds the directory without attributes.
// With the witness still present a missing attribute stays an error.
func (p *pass) diskGone(d sysfs.Dir, witness string, err error) error {
	if err == nil || errors.Is(err, errVanished) || !sysfs.IsNotExist(err) {
		return err
	}
	if _, serr := d.Stat(witness); sysfs.IsNotExist(serr) {
		return errVanished
	}
	return err
}
