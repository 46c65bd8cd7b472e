package intent

import (
	"errors"
	"fmt"
	"sync"

	"github.com/pathmend/pathmend/pkg/volume"
)

// errReleased is returned by a Lease used after Unlock.
var errReleased = errors.New("lease used after it was released")

// Lease is the held lock of one target. While it is held no other actor
// attaches, detaches, repairs, reconnects or kicks anything of the target,
// and no record of the target is created, set detaching or deleted but
// through it: what its Listing and CoTenants return stays true until
// Unlock (publication changes and attaching → staged aside, which change
// no co-tenant).
type Lease struct {
	o       *Owner
	target  volume.Target
	mu      sync.Mutex
	release func()
}

// Target is the leased target.
func (l *Lease) Target() volume.Target { return l.target }

// Unlock releases the lease; later calls do nothing.
func (l *Lease) Unlock() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.release != nil {
		l.release()
		l.release = nil
	}
}

func (l *Lease) held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.release == nil {
		return errReleased
	}
	return nil
}

// Listing reads the records of the target, and the unreadable record files
// that may belong to it (their envelope names it or no target at all).
func (l *Lease) Listing() (volume.Listing, error) {
	if err := l.held(); err != nil {
		return volume.Listing{}, err
	}
	all, err := l.o.Scan()
	if err != nil {
		return volume.Listing{}, err
	}
	return all.Of(l.target), nil
}

// CoTenants returns every record of the target other than volumeID's, in
// any state, and the unreadable files that may belong to the target: the
// co-tenants a teardown for volumeID must spare (volume.CoTenants.Err
// says whether it may happen at all). The error is a failure to read the
// store's directory.
func (l *Lease) CoTenants(volumeID string) (volume.CoTenants, error) {
	ls, err := l.Listing()
	if err != nil {
		return volume.CoTenants{}, err
	}
	return coTenantsOf(ls, volumeID), nil
}

// coTenantsOf is CoTenants from a listing of one target.
func coTenantsOf(ls volume.Listing, volumeID string) volume.CoTenants {
	var co volume.CoTenants
	for _, r := range ls.Records {
		if r.VolumeID != volumeID {
			co.Records = append(co.Records, r)
		}
	}
	for _, u := range ls.Unreadable {
		// A file that says it is the volume's own record is not a
		// co-tenant; one that says nothing might be anyone's.
		if u.VolumeID == "" || u.VolumeID != volumeID {
			co.Unreadable = append(co.Unreadable, u)
		}
	}
	return co
}

// Put writes a record of the target in any state: a new record
// (attaching), a change to detaching, or any other. StateSince is stamped
// when the state changes. A record whose file exists but cannot be read
// is not overwritten: it may be what protects something.
func (l *Lease) Put(rec volume.Record) error {
	if err := l.held(); err != nil {
		return err
	}
	if rec.Target() != l.target {
		return fmt.Errorf("record of volume %s: its target %s is not the leased %s", rec.VolumeID, rec.Target(), l.target)
	}
	cur, err := l.o.store.Get(rec.VolumeID)
	exists := err == nil
	switch {
	case exists && cur.Target() != rec.Target():
		return fmt.Errorf("record of volume %s: it is a volume of %s, not %s", rec.VolumeID, cur.Target(), rec.Target())
	case err != nil && !errors.Is(err, volume.ErrNotFound):
		return fmt.Errorf("record of volume %s: %w", rec.VolumeID, err)
	}
	return l.o.put(cur, exists, rec)
}

// Delete removes the record of volumeID, which must be the target's.
// Deleting a record that does not exist succeeds.
func (l *Lease) Delete(volumeID string) error {
	if err := l.held(); err != nil {
		return err
	}
	cur, err := l.o.store.Get(volumeID)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("delete record of volume %s: %w", volumeID, err)
	case cur.Target() != l.target:
		return fmt.Errorf("delete record of volume %s: it is a volume of %s, not the leased %s", volumeID, cur.Target(), l.target)
	}
	return l.o.store.Delete(volumeID)
}
