package nvme

import (
	"errors"
	"fmt"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// subsystem reads class/nvme-subsystem/<name>: its attributes, the links
// to its member controllers and its multipath heads.
func (r *reader) subsystem(name SubsystemName) (Subsystem, error) {
	dir := classSubsystem + "/" + string(name)
	entries, err := r.fs.ReadDir(dir)
	if err != nil {
		return Subsystem{}, r.vanished(dir, err)
	}
	s := Subsystem{Name: name, Controllers: []ControllerName{}, Namespaces: []Namespace{}}
	if s.NQN, err = r.attr(dir, "subsysnqn"); err != nil {
		return Subsystem{}, err
	}
	if s.Model, err = r.attr(dir, "model"); err != nil {
		return Subsystem{}, err
	}
	if s.Serial, err = r.attr(dir, "serial"); err != nil {
		return Subsystem{}, err
	}
	if s.IOPolicy, err = r.optional(dir, "iopolicy", entries); err != nil {
		return Subsystem{}, err
	}
	if s.Type, err = r.optional(dir, "subsystype", entries); err != nil {
		return Subsystem{}, err
	}
	// The directory holds attributes, one link per member controller
	// (nvme<X>) and, with native multipath, one directory per head
	// (nvme<N>n<H>). Everything else (power/, uevent, the subsystem
	// class link) is not pathmend's business.
	for _, e := range entries {
		if c := ControllerName(e); c.Instance() >= 0 {
			s.Controllers = append(s.Controllers, c)
			continue
		}
		d, ok := parseDiskName(e)
		if !ok || d.isLeg() {
			continue
		}
		ns := Namespace{Subsystem: name, HeadInstance: d.head, Head: DeviceName(e)}
		err := r.identity(dir+"/"+e, "block/"+e, &ns)
		if errors.Is(err, errVanished) {
			r.skip(dir+"/"+e, name, errVanished.Error())
			continue
		}
		if err != nil {
			return Subsystem{}, err
		}
		s.Namespaces = append(s.Namespaces, ns)
	}
	sortByInstance(s.Controllers, func(c ControllerName) (int, string) { return c.Instance(), string(c) })
	return s, nil
}

// identity reads the namespace identity attributes of a head or
// per-controller disk (drivers/nvme/host/core.c, nvme_ns_id_attrs). nsid,
// wwid and size are always published; the kernel hides nguid when it is
// zero and uuid when both it and the NGUID are. link is the disk's
// block/<disk> entry, the witness of a deletion in progress.
func (r *reader) identity(dir, link string, ns *Namespace) (err error) {
	defer func() { err = r.diskGone(link, err) }()
	nsid, err := r.number(dir, "nsid", 32)
	if err != nil {
		return err
	}
	ns.NSID = uint32(nsid)
	if ns.NGUID, err = r.optional(dir, "nguid", nil); err != nil {
		return err
	}
	if ns.UUID, err = r.optional(dir, "uuid", nil); err != nil {
		return err
	}
	if ns.WWID, err = r.attr(dir, "wwid"); err != nil {
		return err
	}
	ns.Sectors, err = r.number(dir, "size", 64)
	return err
}

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
// sub is the subsystem that lists the controller, for Skip records.
func (r *reader) controller(name ControllerName, sub SubsystemName) (Controller, []ctrlDisk, error) {
	dir := classNVMe + "/" + string(name)
	entries, err := r.fs.ReadDir(dir)
	if err != nil {
		return Controller{}, nil, r.vanished(dir, err)
	}
	c := Controller{Name: name, Subsystem: sub}
	if err := r.controllerAttrs(dir, entries, &c); err != nil {
		return Controller{}, nil, err
	}
	// The kernel creates the controller directory once and never renames
	// into it, so its mtime is the controller's creation time. A failed
	// stat leaves CreatedAt zero: "unknown", never "young".
	if fi, err := r.fs.Stat(dir); err == nil {
		c.CreatedAt = fi.ModTime()
	} else if err = r.vanished(dir, err); errors.Is(err, errVanished) {
		return Controller{}, nil, err
	}

	// Legs (nvme<N>c<X>n<H>) and, with multipath off, the controller's
	// own disks (nvme<X>n<H>) are child directories; the generic
	// character devices (ng<X>n<H>) and everything else do not parse.
	var devs []ctrlDisk
	for _, e := range entries {
		d, ok := parseDiskName(e)
		if !ok {
			continue
		}
		devDir := dir + "/" + e
		cd := ctrlDisk{name: DeviceName(e), disk: d, path: Path{Controller: name, Device: DeviceName(e)}}
		var err error
		if !d.isLeg() {
			cd.ns = &Namespace{HeadInstance: d.head}
			err = r.identity(devDir, "block/"+e, cd.ns)
		}
		if err == nil {
			err = r.ana(devDir, &cd.path)
		}
		if errors.Is(err, errVanished) {
			r.skip(devDir, sub, errVanished.Error())
			continue
		}
		if err != nil {
			return Controller{}, nil, err
		}
		devs = append(devs, cd)
	}
	return c, devs, nil
}

// controllerAttrs reads the attributes of nvme_dev_attrs that pathmend
// uses. The fabrics attributes are required of fabrics controllers only:
// the kernel hides them when a controller has no fabrics options (PCIe).
func (r *reader) controllerAttrs(dir string, entries []string, c *Controller) error {
	var err error
	var state string
	if state, err = r.attr(dir, "state"); err != nil {
		return err
	}
	c.State = ControllerState(state)
	if c.Transport, err = r.attr(dir, "transport"); err != nil {
		return err
	}
	cntlid, err := r.number(dir, "cntlid", 16)
	if err != nil {
		return err
	}
	c.CntlID = uint16(cntlid)
	if c.SubsysNQN, err = r.attr(dir, "subsysnqn"); err != nil {
		return err
	}
	kato, err := r.attr(dir, "kato")
	if err != nil {
		return err
	}
	if c.KATO, err = parseInt(kato); err != nil {
		return fmt.Errorf("parse %s/kato: %w", dir, err)
	}
	// A PCIe controller's address is its PCI slot, not key=value pairs,
	// and it has no fabrics options; nvme-loop publishes no address.
	if !c.Fabrics() {
		c.RawAddress, err = r.optional(dir, "address", entries)
		return err
	}
	if c.Transport == "loop" {
		c.RawAddress, err = r.optional(dir, "address", entries)
	} else {
		c.RawAddress, err = r.attr(dir, "address")
	}
	if err != nil {
		return err
	}
	if c.Address, err = ParseAddress(c.RawAddress); err != nil {
		return fmt.Errorf("parse %s/address: %w", dir, err)
	}
	if c.HostNQN, err = r.attr(dir, "hostnqn"); err != nil {
		return err
	}
	if c.CtrlLossTmo, err = r.timeout(dir, "ctrl_loss_tmo"); err != nil {
		return err
	}
	if c.ReconnectDelay, err = r.timeout(dir, "reconnect_delay"); err != nil {
		return err
	}
	c.FastIOFailTmo, err = r.timeout(dir, "fast_io_fail_tmo")
	return err
}

// ana reads the optional ANA attributes of a leg or per-controller disk.
// The kernel hides both when the controller does not use ANA; a leg being
// deleted looks the same, because the kernel removes the disk's attribute
// group (nsid, ana_state, ana_grpid, …) before its directory. So a missing
// ana_state means "no ANA" only while the leg's nsid is still there.
func (r *reader) ana(dir string, p *Path) error {
	witness := dir + "/nsid"
	state, ok, err := r.attrs.ReadOptionalAttr(dir + "/ana_state")
	if err != nil {
		return r.diskGone(witness, r.vanished(dir, err))
	}
	if !ok {
		if _, err := r.fs.Stat(witness); err != nil {
			return r.diskGone(witness, r.vanished(dir, err))
		}
		return nil
	}
	p.ANAState = ANAState(state)
	// The kernel publishes ana_grpid together with ana_state.
	grp, err := r.attr(dir, "ana_grpid")
	if err != nil {
		return r.diskGone(witness, err)
	}
	g, err := parseUint(grp, 32)
	if err != nil {
		return fmt.Errorf("parse %s/ana_grpid: %w", dir, err)
	}
	p.ANAGroup = uint32(g)
	return nil
}

// diskGone turns a missing attribute of a namespace block device into
// errVanished when witness is gone too: del_gendisk removes the disk's
// block/<disk> link, then its attribute groups, then its directory, so a
// read in between finds the directory without attributes. With the
// witness still present a missing attribute stays an error.
func (r *reader) diskGone(witness string, err error) error {
	if err == nil || errors.Is(err, errVanished) || !sysfs.IsNotExist(err) {
		return err
	}
	if _, serr := r.fs.Stat(witness); sysfs.IsNotExist(serr) {
		return errVanished
	}
	return err
}

// attach hangs the namespace devices of controller c on its subsystem s.
// A leg must name s and c, and its head must exist in s; a leg whose head
// is missing is a namespace being added or removed right now, and is
// recorded as a Skip so that Inspect leaves s alone this time.
func (r *reader) attach(s *Subsystem, c *Controller, devs []ctrlDisk) {
	for _, d := range devs {
		where := classNVMe + "/" + string(c.Name) + "/" + string(d.name)
		if d.disk.isLeg() && (d.disk.first != s.Name.Instance() || d.disk.ctrl != c.Name.Instance()) {
			r.skip(where, s.Name, fmt.Sprintf("leg name does not match %s and %s", s.Name, c.Name))
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
			r.skip(where, s.Name, "leg without namespace head "+string(d.disk.headName()))
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
