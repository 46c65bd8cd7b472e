package iscsi

import "github.com/pathmend/pathmend/pkg/sysfs"

// What a Reader remembers of the objects it read. The static fields of a
// memo are trusted only while the object's directory has the identity
// they were read under (a new identity starts a new memo); the other
// fields keep the last text of an attribute that is read every pass, so
// that an unchanged value costs no allocation.

// object is what a memo of a directory starts with: the pass that last
// saw the directory, its path (a class link or block/dm-N), and the
// identity the memo's attributes belong to.
type object struct {
	seen uint64
	rel  string
	id   sysfs.Identity
}

// open opens o's directory for this pass. same is false when it is not
// the directory o's memo describes (or the memo is new): the caller
// forgets what the memo holds. Errors are OpenDir's, for the caller to
// tell a vanished object from a broken one.
func (p *pass) open(o *object) (d sysfs.Dir, same bool, err error) {
	if d, err = p.root.OpenDir(o.rel); err != nil {
		return sysfs.Dir{}, false, err
	}
	o.seen, same, o.id = p.r.pass, d.Identity() == o.id, d.Identity()
	return d, same, nil
}

// sessionMemo remembers class/iscsi_session/<name>.
type sessionMemo struct {
	object
	// static: the class link's target (host, session device), targetname,
	// tpgt, ifacename.
	static                bool
	host                  HostID
	sessDev               string
	targetName, ifaceName string
	tpgt                  int
	tpgtRaw               string
	state, recoveryTmo    string
	targetID              string
	initiatorName         string
	// devices is the last listing of the session device; targets and
	// luns remember what lies below it, by entry name.
	devices []string
	targets map[string]*targetMemo
}

// targetMemo remembers a session's target<H:C:T> directory.
type targetMemo struct {
	seen uint64
	rel  string
	devs []string
	luns map[string]*lunMemo
}

// lunMemo remembers a SCSI device H:C:T:L: its paths below the target
// directory, built once, and its last values.
type lunMemo struct {
	seen uint64
	// state and wwid are relative to the target directory, vpd and block
	// to the root.
	state, wwid, vpd, block string
	stateText, wwidText     string
	disks                   []string
	disk                    *diskMemo
}

// diskMemo remembers the block device of a LUN: size relative to the
// LUN's block directory, holders to the root.
type diskMemo struct {
	name          string
	size, holders string
	sizeText      string
	holderNames   []string
}

// connMemo remembers class/iscsi_connection/<name>.
type connMemo struct {
	object
	// static: persistent_address, persistent_port.
	static            bool
	persistentAddress string
	persistentPort    int
	state             string
	address, port     string
}

// mapMemo remembers block/dm-N.
type mapMemo struct {
	object
	// uuid is static once it is set: the kernel sets a device-mapper
	// device's UUID at most once.
	uuid            string
	name, size      string
	slaves, holders []string
}
