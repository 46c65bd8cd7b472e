package nvme

import (
	"errors"
	"maps"
	"slices"
	"sync"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Sysfs directories Read starts from, relative to the sysfs root.
const (
	classNVMe      = "class/nvme"
	classSubsystem = "class/nvme-subsystem"
)

// errVanished marks a read that failed because the object's directory
// disappeared: the kernel removed it between listing and reading.
var errVanished = errors.New("vanished during the read")

// errOtherTarget marks a subsystem a ReadTarget looked at that answers
// another NQN: its heads are not read.
var errOtherTarget = errors.New("another subsystem NQN")

// Read reads the NVMe state of the host from fsys in one pass: every
// subsystem with its namespaces, then every controller with its legs. It
// starts no process and writes nothing, and it remembers nothing: every
// attribute is read (pathmend diagnose, the attacher). A loop that reads
// the same host again and again keeps a Reader instead.
//
// A missing class/nvme or class/nvme-subsystem directory (the modules are
// not loaded) reads as an empty Host. A missing required attribute is an
// error naming its path. An object whose directory disappears while it is
// read is a race with the kernel, not an error: it is left out and listed
// in Host.Skipped.
func Read(fsys sysfs.FS) (*Host, error) {
	return NewReader(fsys, ScopeAll).Read()
}

// Scope is what a Reader reads.
type Scope uint8

const (
	// ScopeAll reads every attribute of the model: a Reader's Host
	// equals what Read returns.
	ScopeAll Scope = iota
	// ScopePaths reads what diagnosis (Inspect), path reports
	// (ReportPaths) and reconnection (ControllersTo, Locate) decide on:
	// every attribute fixed for an object's life (read once per object),
	// plus the presence of every object, controller state and creation
	// time and the ANA state of every leg, read every time. The
	// attributes that change while an object lives and that no decision
	// reads are left zero, not read: Controller.CntlID, KATO,
	// CtrlLossTmo, ReconnectDelay, FastIOFailTmo, RawAddress and
	// Address.SrcAddr (the rest of Address is the controller's fabrics
	// options, fixed at its creation), Subsystem.IOPolicy,
	// Namespace.Sectors and Path.ANAGroup. A ScopePaths Host equals a
	// ScopeAll Host with those fields zeroed; the monitor reads this way.
	ScopePaths
)

// Reader reads the NVMe state of one host again and again, as the
// monitor does every tick, and returns a Host equal to what Read would
// return at that moment (with ScopePaths: to it with the fields that
// scope leaves out zeroed), except that it knows the address of a
// controller that is not live now if it read it while it was (Read
// reports Controller.AddressUnknown for it). It lists every directory
// and re-reads every attribute that can change while its kernel object
// lives (controller state, cntlid, kato, address — only while the
// controller is live —, timeouts, ANA state and group, iopolicy,
// namespace size) on every Read, and reads the attributes that cannot
// (a subsystem's NQN, model, serial and type; a controller's transport,
// subsystem NQN and host NQN; a namespace's nsid, NGUID, UUID and WWID)
// once per object: they are kept under the sysfs.Identity of the object's
// directory, so an object re-created under a used name (a new controller
// that is nvme3 again, a namespace head re-created as nvme0n1) is read
// afresh. docs/performance.md holds the kernel facts each choice rests on.
//
// A Reader is safe for concurrent use; Reads are serialized.
type Reader struct {
	mu    sync.Mutex
	scope Scope
	attrs *sysfs.AttrReader
	// pass numbers the Reads; a memo not seen by the last successful
	// pass is dropped.
	pass        uint64
	subsysClass listing
	ctrlClass   listing
	// kept is set while the two class listings are as the last read
	// that listed both left them and nothing said they may have changed
	// since (Forget); byNQN is the index PeekTarget builds from them.
	kept        bool
	byNQN       *classIndex
	subsystems  map[SubsystemName]*subsysMemo
	controllers map[ControllerName]*ctrlMemo
	// owner and devs are scratch space reused by every pass.
	owner map[ControllerName]*Subsystem
	devs  []ctrlDisk
}

// NewReader returns a Reader of fsys, reading scope, that remembers
// nothing yet. It reads nothing.
func NewReader(fsys sysfs.FS, scope Scope) *Reader {
	return &Reader{
		scope:       scope,
		attrs:       sysfs.NewAttrReader(fsys),
		subsystems:  map[SubsystemName]*subsysMemo{},
		controllers: map[ControllerName]*ctrlMemo{},
		owner:       map[ControllerName]*Subsystem{},
	}
}

// Counts returns the attribute reads, directory listings and stats the
// Reader has made so far.
func (r *Reader) Counts() sysfs.Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attrs.Counts()
}

// Read reads the host once more; see Reader and the package function Read,
// whose result and errors it matches.
func (r *Reader) Read() (*Host, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pass++
	p := &pass{r: r, fs: r.attrs.FS(), attrs: r.attrs, root: r.attrs.OpenRoot()}
	defer p.root.Close()
	h, err := p.host()
	if err != nil {
		r.forget()
		return nil, err
	}
	r.prune()
	r.listed()
	return h, nil
}

// pass carries one Read: the Reader's memory, the FS, its root held open
// for the pass, and what was skipped.
type pass struct {
	r       *Reader
	fs      sysfs.FS
	attrs   *sysfs.AttrReader
	root    sysfs.Dir
	skipped []Skip
	// want, when set, is the one subsystem NQN a ReadTarget reads.
	want string
	// moved is set when an object the Reader knew was found gone, or
	// another object under its name (open).
	moved bool
}

// host is one Read: subsystems with their namespaces, then controllers
// with their legs, hung on their subsystems.
func (p *pass) host() (*Host, error) {
	h := &Host{Scope: p.r.scope}
	subNames, err := p.list(classSubsystem, &p.r.subsysClass, func(n string) bool { return SubsystemName(n).Instance() >= 0 })
	if err != nil {
		return nil, err
	}
	h.Subsystems = make([]Subsystem, 0, len(subNames))
	for _, n := range subNames {
		s, err := p.subsystem(SubsystemName(n))
		if errors.Is(err, errVanished) {
			p.skip(classSubsystem+"/"+n, SubsystemName(n), errVanished.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		h.Subsystems = append(h.Subsystems, s)
	}
	sortByInstance(h.Subsystems, func(s Subsystem) (int, string) { return s.Name.Instance(), string(s.Name) })
	owner := p.r.owner
	clear(owner)
	for i := range h.Subsystems {
		for _, c := range h.Subsystems[i].Controllers {
			owner[c] = &h.Subsystems[i]
		}
	}

	ctrlNames, err := p.list(classNVMe, &p.r.ctrlClass, func(n string) bool { return ControllerName(n).Instance() >= 0 })
	if err != nil {
		return nil, err
	}
	h.Controllers = make([]Controller, 0, len(ctrlNames))
	for _, n := range ctrlNames {
		name := ControllerName(n)
		sub := owner[name]
		var subName SubsystemName
		if sub != nil {
			subName = sub.Name
		}
		c, devs, err := p.controller(name, subName)
		if errors.Is(err, errVanished) {
			p.skip(classNVMe+"/"+n, subName, errVanished.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		h.Controllers = append(h.Controllers, c)
		if sub == nil {
			if len(devs) > 0 {
				p.skip(classNVMe+"/"+n, "", "controller no subsystem lists")
			}
			continue
		}
		p.attach(sub, &c, devs)
	}
	clear(owner)
	sortHost(h)
	h.Skipped = p.skipped
	return h, nil
}

func (p *pass) skip(path string, sub SubsystemName, reason string) {
	p.skipped = append(p.skipped, Skip{Path: path, Subsystem: sub, Reason: reason})
}

// listing is a class directory's entries as last read, and the part of
// them a reader keeps; kept is reused while the entries do not change.
type listing struct {
	all, kept []string
	valid     bool
}

// list returns the entries of a class directory that match keep. A missing
// directory means the module is not loaded and lists nothing.
func (p *pass) list(dir string, l *listing, keep func(string) bool) ([]string, error) {
	d, err := p.root.OpenDir(dir)
	if sysfs.IsNotExist(err) {
		*l = listing{}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Names(l.all)
	if err != nil {
		return nil, err
	}
	if !l.valid || !sameSlice(names, l.all) {
		*l = listing{all: names, kept: slices.Clip(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !keep(n) })), valid: true}
	}
	return l.kept, nil
}

// sameSlice reports whether a and b are the same slice (Dir.Names returns
// its prev argument when a directory did not change).
func sameSlice(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// vanished turns the failure of a read below dir into errVanished when dir
// itself is gone, and returns err unchanged otherwise: a missing attribute
// in a directory that still exists is a real error.
func (p *pass) vanished(dir string, err error) error {
	if !sysfs.IsNotExist(err) {
		return err
	}
	if _, serr := p.fs.Stat(dir); sysfs.IsNotExist(serr) {
		return errVanished
	}
	return err
}

// prune forgets the objects the last pass did not see.
func (r *Reader) prune() {
	maps.DeleteFunc(r.subsystems, func(_ SubsystemName, m *subsysMemo) bool { return m.seen != r.pass })
	maps.DeleteFunc(r.controllers, func(_ ControllerName, m *ctrlMemo) bool { return m.seen != r.pass })
}

// sortByInstance sorts kernel objects by instance number, then name.
func sortByInstance[T any](s []T, key func(T) (int, string)) {
	slices.SortFunc(s, func(a, b T) int {
		ai, as := key(a)
		bi, bs := key(b)
		return compareInstance(ai, bi, as, bs)
	})
}

// sortHost puts h in the order every read gives: controllers by
// instance, and within each subsystem its namespaces by head and each
// namespace's paths by controller.
func sortHost(h *Host) {
	sortByInstance(h.Controllers, func(c Controller) (int, string) { return c.Name.Instance(), string(c.Name) })
	for i := range h.Subsystems {
		s := &h.Subsystems[i]
		sortByInstance(s.Namespaces, func(n Namespace) (int, string) { return n.HeadInstance, string(n.Head) })
		for j := range s.Namespaces {
			sortByInstance(s.Namespaces[j].Paths, func(p Path) (int, string) {
				return p.Controller.Instance(), string(p.Controller)
			})
		}
	}
}
