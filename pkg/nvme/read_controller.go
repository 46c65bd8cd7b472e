package nvme

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// ctrlDisk is a namespace device found below a controller directory: a
// hidden leg, or a per-controller disk when multipath is off.
type ctrlDisk struct {
	name DeviceName
	disk diskName
	path Path
	// ns holds the identity of a per-controller disk; nil for a leg.
	ns *Namespace
}

// controller reads class/nvme/<name> and the namespace devices below it.
// sub is the subsystem that lists the controller, for Skip records. The
// devices returned are valid until the next call.
func (p *pass) controller(name ControllerName, sub SubsystemName) (Controller, []ctrlDisk, error) {
	m := p.r.controllers[name]
	if m == nil {
		m = &ctrlMemo{object: object{rel: classNVMe + "/" + string(name)}}
		p.r.controllers[name] = m
	}
	d, same, err := p.open(&m.object)
	if err != nil {
		return Controller{}, nil, err
	}
	defer d.Close()
	if !same {
		// Another controller than the one remembered under this name.
		*m = ctrlMemo{object: m.object}
	}
	o := obj{p: p, d: d, id: d.Identity()}
	entries, err := d.Names(m.names)
	if err != nil {
		return Controller{}, nil, o.vanished(err)
	}
	m.names = entries
	c := Controller{Name: name, Subsystem: sub}
	if err := p.controllerAttrs(o, m, entries, &c); err != nil {
		return Controller{}, nil, err
	}
	// The kernel creates the controller directory once and never renames
	// into it, so its mtime (from the stat of the open directory) is the
	// controller's creation time.
	c.CreatedAt = d.Identity().ModTime()

	// Legs (nvme<N>c<X>n<H>) and, with multipath off, the controller's
	// own disks (nvme<X>n<H>) are child directories; the generic
	// character devices (ng<X>n<H>) and everything else do not parse.
	if m.from == nil || !sameSlice(entries, m.from) {
		m.diskNames, m.from = slices.DeleteFunc(slices.Clone(entries), func(e string) bool { _, ok := parseDiskName(e); return !ok }), entries
		if m.from == nil {
			m.from = []string{}
		}
	}
	if m.disks == nil {
		m.disks = make(map[string]*diskMemo, len(m.diskNames))
	}
	devs := p.r.devs[:0]
	for _, e := range m.diskNames {
		dn, _ := parseDiskName(e)
		dm := m.disks[e]
		if dm == nil {
			dm = newDiskMemo(e, dn)
			m.disks[e] = dm
		}
		dm.seen = p.r.pass
		cd := ctrlDisk{name: DeviceName(e), disk: dn, path: Path{Controller: name, Device: DeviceName(e)}}
		err := p.ctrlDisk(d, e, dm, &cd)
		if errors.Is(err, errVanished) {
			p.skip(m.rel+"/"+e, sub, errVanished.Error())
			continue
		}
		if err != nil {
			return Controller{}, nil, err
		}
		devs = append(devs, cd)
	}
	p.r.devs = devs
	maps.DeleteFunc(m.disks, func(_ string, dm *diskMemo) bool { return dm.seen != p.r.pass })
	return c, devs, nil
}

// ctrlDisk reads the leg or per-controller disk entry below controller
// directory d.
func (p *pass) ctrlDisk(d sysfs.Dir, entry string, dm *diskMemo, cd *ctrlDisk) error {
	o := obj{p: p, d: d, sub: entry}
	if !dm.name.isLeg() {
		var err error
		if o, err = p.disk(d, entry, dm); err != nil {
			return err
		}
		cd.ns = &Namespace{HeadInstance: dm.name.head}
		if err := p.identity(o, dm, cd.ns); err != nil {
			return p.diskGone(p.root, "block/"+entry, err)
		}
	}
	return p.ana(o, dm, &cd.path)
}

// controllerAttrs reads the attributes of nvme_dev_attrs that pathmend
// uses. The fabrics attributes are required of fabrics controllers only:
// the kernel hides them when a controller has no fabrics options (PCIe).
// transport, subsysnqn and hostnqn are fixed for the controller's life
// (its ops, its subsystem and its options); state, cntlid (assigned by
// the target at every connect of the admin queue), kato, address (whose
// src_addr follows the connection; read only while the controller is
// live) and the writable timeouts are read every time.
func (p *pass) controllerAttrs(o obj, m *ctrlMemo, entries []string, c *Controller) error {
	known, all := m.static, p.r.scope == ScopeAll
	if err := o.text("state", &m.state); err != nil {
		return err
	}
	c.State = ControllerState(m.state)
	if !known {
		if err := o.text("transport", &m.transport); err != nil {
			return err
		}
	}
	c.Transport = m.transport
	var err error
	if all {
		if c.CntlID, err = parsed(o, "cntlid", &m.cntlid, parseU16); err != nil {
			return err
		}
	}
	if !known {
		if err := o.text("subsysnqn", &m.subsysNQN); err != nil {
			return err
		}
	}
	c.SubsysNQN = m.subsysNQN
	// A controller being set up (its connect and identify not done: the
	// write to /dev/nvme-fabrics has not returned) is in sysfs before it
	// has a subsystem, and its subsysnqn reads "(efault)". Its static
	// attributes are read again until it has one.
	settled := !noSubsystemYet(m.subsysNQN)
	if all {
		if c.KATO, err = parsed(o, "kato", &m.kato, parseInt); err != nil {
			return err
		}
	}
	// A PCIe controller's address is its PCI slot, not key=value pairs,
	// and it has no fabrics options; nvme-loop publishes no address.
	if !c.Fabrics() {
		if all {
			err = o.optional("address", "address", entries, &m.rawAddress)
			c.RawAddress = m.rawAddress
		}
		m.static = err == nil && settled
		return err
	}
	// The address is read only while the controller is live: on
	// Debian's 6.1 kernel a read of it while nvme-tcp resets or
	// reconnects the controller can oops in nvme_tcp_get_address
	// (kernel_getsockname on a socket being released), and the oops
	// leaves the controller resetting for good. Its fabrics options
	// (traddr, trsvcid, host_traddr, host_iface) are fixed at the
	// controller's creation, so the ones read while it was live stand
	// while it is not; a controller never seen live has no known
	// address.
	live := c.State == StateLive
	switch {
	case c.Transport == "loop" && !slices.Contains(entries, "address"):
		c.RawAddress, c.Address = "", Address{}
	case live && (all || !m.address.ok):
		if c.Address, err = parsed(o, "address", &m.address, ParseAddress); err != nil {
			return err
		}
		c.RawAddress = m.address.raw
	case m.address.ok:
		c.Address = m.address.val
		if !live {
			// src_addr is the connection's, and there is none.
			c.RawAddress, c.Address.SrcAddr = "", ""
		}
	default:
		c.AddressUnknown = true
	}
	if !all {
		// src_addr follows the connection and is not read in this
		// scope.
		c.RawAddress, c.Address.SrcAddr = "", ""
	}
	if !known {
		if err := o.text("hostnqn", &m.hostNQN); err != nil {
			return err
		}
	}
	c.HostNQN = m.hostNQN
	if all {
		if c.CtrlLossTmo, err = parsed(o, "ctrl_loss_tmo", &m.lossTmo, ParseTimeout); err != nil {
			return err
		}
		if c.ReconnectDelay, err = parsed(o, "reconnect_delay", &m.reconnect, ParseTimeout); err != nil {
			return err
		}
		if c.FastIOFailTmo, err = parsed(o, "fast_io_fail_tmo", &m.fastIO, ParseTimeout); err != nil {
			return err
		}
	}
	m.static = settled
	return nil
}

// noSubsystemYet reports whether a controller's subsysnqn is the kernel's
// text for a subsystem pointer not set yet ("(efault)" for a field of a
// NULL structure, "(null)" for NULL).
func noSubsystemYet(nqn string) bool {
	return nqn == "(efault)" || nqn == "(null)" || nqn == ""
}

// ana reads the optional ANA attributes of a leg or per-controller disk.
// The kernel hides both when the controller does not use ANA; a leg being
// deleted looks the same, because the kernel removes the disk's attribute
// group (nsid, ana_state, ana_grpid, …) before its directory. So a missing
// ana_state means "no ANA" only while the leg's nsid is still there. Both
// change with every ANA log the controller reads: they are read every
// time.
func (p *pass) ana(o obj, dm *diskMemo, path *Path) error {
	b, ok, err := o.d.ReadOptionalAttr(dm.paths.anaState)
	if err != nil {
		return p.diskGone(o.d, dm.paths.nsid, o.vanished(err))
	}
	if !ok {
		dm.anaState = ""
		if _, err := o.d.Stat(dm.paths.nsid); err != nil {
			return p.diskGone(o.d, dm.paths.nsid, o.vanished(err))
		}
		return nil
	}
	dm.anaState = sysfs.Intern(b, dm.anaState)
	path.ANAState = ANAState(dm.anaState)
	if p.r.scope != ScopeAll {
		return nil
	}
	// The kernel publishes ana_grpid together with ana_state.
	b, err = o.d.ReadAttr(dm.paths.anaGroup)
	if err != nil {
		return p.diskGone(o.d, dm.paths.nsid, err)
	}
	if path.ANAGroup, err = dm.anaGroup.get(b, parseU32); err != nil {
		return fmt.Errorf("parse %s/%s: %w", o.d.Rel(), dm.paths.anaGroup, err)
	}
	return nil
}

// attach hangs the namespace devices of controller c on its subsystem s.
// A leg must name s and c, and its head must exist in s; a leg whose head
// is missing is a namespace being added or removed right now, and is
// recorded as a Skip so that Inspect leaves s alone this time.
func (p *pass) attach(s *Subsystem, c *Controller, devs []ctrlDisk) {
	where := func(d ctrlDisk) string { return classNVMe + "/" + string(c.Name) + "/" + string(d.name) }
	for _, d := range devs {
		if d.disk.isLeg() && (d.disk.first != s.Name.Instance() || d.disk.ctrl != c.Name.Instance()) {
			p.skip(where(d), s.Name, fmt.Sprintf("leg name does not match %s and %s", s.Name, c.Name))
			continue
		}
		i := -1
		for j := range s.Namespaces {
			if s.Namespaces[j].HeadInstance == d.disk.head {
				i = j
				break
			}
		}
		switch {
		case i < 0 && d.disk.isLeg():
			p.skip(where(d), s.Name, "leg without namespace head "+string(d.disk.headName()))
			continue
		case i < 0:
			// The first per-controller disk of a namespace (multipath
			// off) describes it; the others share its head instance and
			// so its identity.
			ns := *d.ns
			ns.Subsystem = s.Name
			s.Namespaces = append(s.Namespaces, ns)
			i = len(s.Namespaces) - 1
		}
		s.Namespaces[i].Paths = append(s.Namespaces[i].Paths, d.path)
	}
}
