package nvme

import (
	"errors"
	"fmt"
	"slices"

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

// Read reads the NVMe state of the host from fsys in one pass: every
// subsystem with its namespaces, then every controller with its legs. It
// starts no process and writes nothing.
//
// A missing class/nvme or class/nvme-subsystem directory (the modules are
// not loaded) reads as an empty Host. A missing required attribute is an
// error naming its path. An object whose directory disappears while it is
// read is a race with the kernel, not an error: it is left out and listed
// in Host.Skipped.
func Read(fsys sysfs.FS) (*Host, error) {
	r := &reader{fs: fsys, attrs: sysfs.NewAttrReader(fsys)}
	h := &Host{}
	subNames, err := r.list(classSubsystem, func(n string) bool { return SubsystemName(n).Instance() >= 0 })
	if err != nil {
		return nil, err
	}
	owner := make(map[ControllerName]*Subsystem)
	h.Subsystems = make([]Subsystem, 0, len(subNames))
	for _, n := range subNames {
		s, err := r.subsystem(SubsystemName(n))
		if errors.Is(err, errVanished) {
			r.skip(classSubsystem+"/"+n, SubsystemName(n), errVanished.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		h.Subsystems = append(h.Subsystems, s)
	}
	sortByInstance(h.Subsystems, func(s Subsystem) (int, string) { return s.Name.Instance(), string(s.Name) })
	for i := range h.Subsystems {
		for _, c := range h.Subsystems[i].Controllers {
			owner[c] = &h.Subsystems[i]
		}
	}

	ctrlNames, err := r.list(classNVMe, func(n string) bool { return ControllerName(n).Instance() >= 0 })
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
		c, devs, err := r.controller(name, subName)
		if errors.Is(err, errVanished) {
			r.skip(classNVMe+"/"+n, subName, errVanished.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		h.Controllers = append(h.Controllers, c)
		if sub == nil {
			if len(devs) > 0 {
				r.skip(classNVMe+"/"+n, "", "controller no subsystem lists")
			}
			continue
		}
		r.attach(sub, &c, devs)
	}
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
	h.Skipped = r.skipped
	return h, nil
}

// reader carries the FS and what was skipped through one Read. Attribute
// reads share one buffer (attrs).
type reader struct {
	fs      sysfs.FS
	attrs   *sysfs.AttrReader
	skipped []Skip
}

func (r *reader) skip(path string, sub SubsystemName, reason string) {
	r.skipped = append(r.skipped, Skip{Path: path, Subsystem: sub, Reason: reason})
}

// list returns the entries of a class directory that match keep. A missing
// directory means the module is not loaded and lists nothing.
func (r *reader) list(dir string, keep func(string) bool) ([]string, error) {
	names, err := r.fs.ReadDir(dir)
	if sysfs.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(names, func(n string) bool { return !keep(n) }), nil
}

// vanished turns the failure of a read below dir into errVanished when dir
// itself is gone, and returns err unchanged otherwise: a missing attribute
// in a directory that still exists is a real error.
func (r *reader) vanished(dir string, err error) error {
	if !sysfs.IsNotExist(err) {
		return err
	}
	if _, serr := r.fs.Stat(dir); sysfs.IsNotExist(serr) {
		return errVanished
	}
	return err
}

// attr reads a required attribute of dir.
func (r *reader) attr(dir, name string) (string, error) {
	v, err := r.attrs.ReadAttr(dir + "/" + name)
	if err != nil {
		return "", r.vanished(dir, err)
	}
	return v, nil
}

// optional reads an attribute a kernel may not publish; present is the
// sorted entry list of dir when the caller has it (nil: try the read).
func (r *reader) optional(dir, name string, present []string) (string, error) {
	if present != nil {
		if _, ok := slices.BinarySearch(present, name); !ok {
			return "", nil
		}
		return r.attr(dir, name)
	}
	v, _, err := r.attrs.ReadOptionalAttr(dir + "/" + name)
	return v, err
}

// number reads a required decimal attribute of at most bits bits.
func (r *reader) number(dir, name string, bits int) (uint64, error) {
	s, err := r.attr(dir, name)
	if err != nil {
		return 0, err
	}
	n, err := parseUint(s, bits)
	if err != nil {
		return 0, fmt.Errorf("parse %s/%s: %w", dir, name, err)
	}
	return n, nil
}

// timeout reads a required fabrics timeout attribute.
func (r *reader) timeout(dir, name string) (Timeout, error) {
	s, err := r.attr(dir, name)
	if err != nil {
		return Timeout{}, err
	}
	t, err := ParseTimeout(s)
	if err != nil {
		return Timeout{}, fmt.Errorf("parse %s/%s: %w", dir, name, err)
	}
	return t, nil
}

// sortByInstance sorts kernel objects by instance number, then name.
func sortByInstance[T any](s []T, key func(T) (int, string)) {
	slices.SortFunc(s, func(a, b T) int {
		ai, as := key(a)
		bi, bs := key(b)
		return compareInstance(ai, bi, as, bs)
	})
}
