package volume

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Target is the storage target a volume lives in: the unit whose kernel
// objects several volumes may share. For nvme-tcp it is the subsystem NQN
// (its controllers are every namespace's paths); for iscsi the target IQN
// (its sessions and node records, one per portal, carry every LUN). The
// zero Target is "unknown".
type Target struct {
	Transport Transport
	// Name is the NQN or the IQN.
	Name string
}

// Target returns the target of the volume context; zero when the context
// names none.
func (c Context) Target() Target {
	switch {
	case c.Transport == TransportNVMeTCP && c.NVMe != nil:
		return Target{Transport: c.Transport, Name: c.NVMe.NQN}
	case c.Transport == TransportISCSI && c.ISCSI != nil:
		return Target{Transport: c.Transport, Name: c.ISCSI.IQN}
	}
	return Target{}
}

// IsZero reports whether the target is unknown.
func (t Target) IsZero() bool { return t == Target{} }

// String renders "nvme-tcp nqn…" or "iscsi iqn…", or "unknown target".
func (t Target) String() string {
	if t.IsZero() {
		return "unknown target"
	}
	return string(t.Transport) + " " + t.Name
}

// Compare orders targets by transport, then name.
func (t Target) Compare(u Target) int {
	if c := strings.Compare(string(t.Transport), string(u.Transport)); c != 0 {
		return c
	}
	return strings.Compare(t.Name, u.Name)
}

// ErrUnreadableRecord is wrapped by every error about a record file that
// exists but cannot be read: corrupt, of a newer version, unreadable from
// disk, or holding another volume. Nothing a record that might be such a
// file protects may be torn down.
var ErrUnreadableRecord = errors.New("staged-volume record cannot be read")

// RecordError is a record file that exists but cannot be read as a
// record. VolumeID and Target are what the file's envelope says, when it
// says (a record of a newer version, one that fails a check); both are
// empty when the file cannot be decoded at all.
type RecordError struct {
	// Path is the record file.
	Path string
	// VolumeID and Target come from the file's envelope; empty or zero
	// when unknown.
	VolumeID string
	Target   Target
	// Err says what is wrong.
	Err error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("staged-volume record %s: %v", e.Path, e.Err)
}

// Unwrap returns the cause and ErrUnreadableRecord.
func (e *RecordError) Unwrap() []error { return []error{e.Err, ErrUnreadableRecord} }

// MayBelongTo reports whether the unreadable record may be one of target
// t's volumes: its envelope names t, or names no target at all.
func (e *RecordError) MayBelongTo(t Target) bool { return e.Target.IsZero() || e.Target == t }

// Listing is every record file of a store: the records that could be
// read, sorted by VolumeID, and the files that could not, sorted by path.
type Listing struct {
	Records    []Record
	Unreadable []*RecordError
}

// Err joins the errors of the unreadable files; nil when there is none.
func (l Listing) Err() error {
	errs := make([]error, len(l.Unreadable))
	for i, u := range l.Unreadable {
		errs[i] = u
	}
	return errors.Join(errs...)
}

// Of returns the part of the listing that concerns target t: its records
// and the unreadable files that may belong to it.
func (l Listing) Of(t Target) Listing {
	var out Listing
	for _, r := range l.Records {
		if r.Target() == t {
			out.Records = append(out.Records, r)
		}
	}
	for _, u := range l.Unreadable {
		if u.MayBelongTo(t) {
			out.Unreadable = append(out.Unreadable, u)
		}
	}
	return out
}

// Targets returns the distinct targets of the readable records and of the
// unreadable files whose envelope names one, sorted.
func (l Listing) Targets() []Target {
	seen := map[Target]bool{}
	var out []Target
	add := func(t Target) {
		if !t.IsZero() && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, r := range l.Records {
		add(r.Target())
	}
	for _, u := range l.Unreadable {
		add(u.Target)
	}
	slices.SortFunc(out, Target.Compare)
	return out
}

// CoTenants is what the node's intent says about a target besides one
// volume: the records of its other volumes in every state (attaching,
// staged, detaching), and the record files that may belong to the target
// but cannot be read. A transport tears down a kernel object of the
// target only when no co-tenant record uses it and Err is nil.
type CoTenants struct {
	// Records are the other volumes of the target, sorted by VolumeID.
	Records []Record
	// Unreadable are record files that may be the target's.
	Unreadable []*RecordError
}

// ErrTeardownBlocked is wrapped by CoTenants.Err: some record that may
// belong to the target cannot be read, so nothing of the target is torn
// down until it can be read or is removed.
var ErrTeardownBlocked = errors.New("no teardown of the target while a record that may be its volume's cannot be read")

// Err is nil when every record that might belong to the target was read;
// otherwise an error wrapping ErrTeardownBlocked that names each
// unreadable file and why it cannot be read.
func (c CoTenants) Err() error {
	if len(c.Unreadable) == 0 {
		return nil
	}
	parts := make([]string, len(c.Unreadable))
	for i, u := range c.Unreadable {
		parts[i] = u.Error()
	}
	return fmt.Errorf("%w: %s", ErrTeardownBlocked, strings.Join(parts, "; "))
}

// IDs lists the co-tenant volume IDs, for log lines.
func (c CoTenants) IDs() []string {
	ids := make([]string, len(c.Records))
	for i, r := range c.Records {
		ids[i] = r.VolumeID
	}
	return ids
}
