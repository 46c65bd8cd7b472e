package nvme

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// What a Reader remembers of the kernel objects it read. A memo's static
// fields hold the attributes that cannot change while the object lives
// and are trusted only while the object's directory has the identity
// they were read under (static is cleared when it changes); the other
// fields remember the last text of a volatile attribute, which is read
// every pass, so that an unchanged value is neither allocated nor parsed
// again.

// object is what a memo of a directory starts with: the pass that last
// saw the directory, its path, and the identity the memo's attributes
// belong to.
type object struct {
	seen uint64
	rel  string
	id   sysfs.Identity
}

// open opens o's directory for this pass. same is false when it is not
// the directory o's memo describes (or the memo is new): the caller
// forgets what the memo holds. A directory the Reader knew that is gone,
// or is another object now, sets the pass's moved.
func (p *pass) open(o *object) (d sysfs.Dir, same bool, err error) {
	d, err = p.root.OpenDir(o.rel)
	if err != nil {
		err = p.vanished(o.rel, err)
		if errors.Is(err, errVanished) && o.id != (sysfs.Identity{}) {
			p.moved = true
		}
		return sysfs.Dir{}, false, err
	}
	prev := o.id
	o.seen, o.id = p.r.pass, d.Identity()
	same = o.id == prev
	if !same && prev != (sysfs.Identity{}) {
		// Another object under a name the Reader knew.
		p.moved = true
	}
	return d, same, nil
}

// subsysMemo remembers class/nvme-subsystem/<name>.
type subsysMemo struct {
	object
	// static: subsysnqn, model, serial, subsystype.
	static                  bool
	nqn, model, serial, typ string
	iopolicy                string
	// names is the directory's last listing; ctrls and heads were
	// derived from the listing in from.
	names, from []string
	ctrls       []ControllerName
	heads       []string
	disks       map[string]*diskMemo
}

// ctrlMemo remembers class/nvme/<name>.
type ctrlMemo struct {
	object
	// static: transport, subsysnqn, hostnqn (read once the transport
	// says the controller is a fabrics one).
	static                        bool
	transport, subsysNQN, hostNQN string
	state                         string
	cntlid                        memo[uint16]
	kato                          memo[int]
	address                       memo[Address]
	rawAddress                    string
	lossTmo, reconnect, fastIO    memo[Timeout]
	// names is the directory's last listing; diskNames were derived
	// from the listing in from.
	names, from []string
	diskNames   []string
	disks       map[string]*diskMemo
}

// diskMemo remembers a namespace block device: a multipath head below its
// subsystem, or a leg or per-controller disk below its controller. The
// attribute paths are relative to that parent directory, built once.
type diskMemo struct {
	seen uint64
	name diskName
	// id and the static identity attributes (nsid, nguid, uuid, wwid)
	// concern heads and per-controller disks; a leg's identity is its
	// head's.
	id                sysfs.Identity
	static            bool
	nsid              uint32
	nguid, uuid, wwid string
	dev               volume.DeviceNumber
	size              memo[uint64]
	anaState          string
	anaGroup          memo[uint32]
	paths             diskPaths
}

// diskPaths are a disk's attribute paths below its parent directory.
type diskPaths struct {
	nsid, nguid, uuid, wwid, dev, size, anaState, anaGroup string
}

func newDiskMemo(entry string, d diskName) *diskMemo {
	at := func(a string) string { return entry + "/" + a }
	return &diskMemo{name: d, paths: diskPaths{
		nsid: at("nsid"), nguid: at("nguid"), uuid: at("uuid"), wwid: at("wwid"), dev: at("dev"),
		size: at("size"), anaState: at("ana_state"), anaGroup: at("ana_grpid"),
	}}
}

// memo remembers an attribute's last text and what it parsed to.
type memo[T any] struct {
	raw string
	val T
	ok  bool
}

// get returns the value of text b: the remembered one when b is the same
// text, parsed (and remembered) otherwise.
func (m *memo[T]) get(b []byte, parse func(string) (T, error)) (T, error) {
	if m.ok && string(b) == m.raw {
		return m.val, nil
	}
	s := string(b)
	v, err := parse(s)
	if err != nil {
		return v, err
	}
	m.raw, m.val, m.ok = s, v, true
	return v, nil
}

// obj is one kernel object's directory during a pass: the open Dir it is
// or lies in, its entry name below that Dir ("" for the Dir itself) and
// the identity the pass found it with (zero when the pass did not stat
// it: a leg, which holds nothing remembered).
type obj struct {
	p   *pass
	d   sysfs.Dir
	sub string
	id  sysfs.Identity
}

// raw reads a required attribute (name relative to o.d). A missing one
// is errVanished when the object's directory is gone or replaced.
func (o obj) raw(name string) ([]byte, error) {
	b, err := o.d.ReadAttr(name)
	if err != nil {
		return nil, o.vanished(err)
	}
	return b, nil
}

// vanished turns the failure of a read below the object into errVanished
// when its directory is gone, or is another directory now, and returns
// err unchanged otherwise: a missing attribute in a directory that still
// exists is a real error.
func (o obj) vanished(err error) error {
	if !sysfs.IsNotExist(err) {
		return err
	}
	var id sysfs.Identity
	var serr error
	if o.sub == "" {
		id, serr = o.p.fs.Identity(o.d.Rel())
	} else {
		id, serr = o.d.Stat(o.sub)
	}
	if sysfs.IsNotExist(serr) || (serr == nil && o.id != (sysfs.Identity{}) && id != o.id) {
		return errVanished
	}
	return err
}

// text reads a required text attribute into *v, keeping *v's string when
// the text did not change.
func (o obj) text(name string, v *string) error {
	b, err := o.raw(name)
	if err != nil {
		return err
	}
	*v = sysfs.Intern(b, *v)
	return nil
}

// optional reads an attribute a kernel may not publish into *v ("" when
// absent). present is the sorted listing of the directory the attribute
// lies in, when the caller has it (nil: try the read); base is the
// attribute's name in that listing.
func (o obj) optional(name, base string, present []string, v *string) error {
	if present != nil {
		if _, ok := slices.BinarySearch(present, base); !ok {
			*v = ""
			return nil
		}
		return o.text(name, v)
	}
	b, ok, err := o.d.ReadOptionalAttr(name)
	if err != nil {
		return err
	}
	if !ok {
		*v = ""
		return nil
	}
	*v = sysfs.Intern(b, *v)
	return nil
}

// parsed reads a required attribute through its memo.
func parsed[T any](o obj, name string, m *memo[T], parse func(string) (T, error)) (T, error) {
	b, err := o.raw(name)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := m.get(b, parse)
	if err != nil {
		return v, fmt.Errorf("parse %s/%s: %w", o.d.Rel(), name, err)
	}
	return v, nil
}

// Parsers of the numeric attributes, for memo.get.
func parseU16(s string) (uint16, error) { n, err := parseUint(s, 16); return uint16(n), err }
func parseU32(s string) (uint32, error) { n, err := parseUint(s, 32); return uint32(n), err }
func parseU64(s string) (uint64, error) { return parseUint(s, 64) }
