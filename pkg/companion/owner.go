package companion

import (
	"github.com/pathmend/pathmend/pkg/volume"
)

// owner answers, from one listing of the node plugin's records, whether
// a target is the node plugin's. One owner per kernel object: a target
// that any staged-volume record names, in any state, is the plugin's; so
// is a target an unreadable record file may belong to, and every target
// while a record file names no target at all (fail closed). Everything
// else on the node is companion mode's.
type owner struct {
	named map[volume.Target]bool
	all   bool
}

func ownerOf(l volume.Listing) owner {
	o := owner{named: map[volume.Target]bool{}}
	for _, r := range l.Records {
		o.named[r.Target()] = true
	}
	for _, u := range l.Unreadable {
		if u.Target.IsZero() {
			o.all = true
		}
		o.named[u.Target] = true
	}
	return o
}

// owns reports whether the NVMe subsystem nqn is the node plugin's.
func (o owner) owns(nqn string) bool {
	return o.all || o.named[volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}]
}

// why says why a target is the plugin's, for the verdict line.
func (o owner) why() string {
	if o.all {
		return "a staged-volume record file names no target (it cannot be read); every target may be the node plugin's"
	}
	return "a staged-volume record of the node plugin names the target"
}
