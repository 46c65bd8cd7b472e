package model

import (
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// What a transport and the loop say to each other when a kernel event
// named one target: the loop reads and plans that target alone, between
// ticks (pkg/monitor, "Events").

// TargetRound is one target as a transport plans it outside a tick.
type TargetRound struct {
	Target volume.Target
	// Listing is the target's staged-volume records as the loop knows
	// them: for a target the model has as owned, the records of its
	// entries, read again from the store; otherwise the store's listing
	// of the target (volume.Listing.Of), unreadable files that may be its
	// included. The job reads them all again under the target's lease.
	Listing volume.Listing
	// Owned: the target is the node plugin's (a record names it) and the
	// loop covers the owned scope. Foreign: no record names it and the
	// loop covers the foreign scope. At most one is set.
	Owned, Foreign bool
}

// TargetPlan is what a transport read and decided of one target.
type TargetPlan struct {
	// Read is set when the transport read the target's kernel objects
	// (nothing is read for a target outside its scopes).
	Read bool
	// Volumes are the target's volumes as the read found them: its staged
	// volumes among the round's records (owned), or the learned target
	// (foreign), with the read's notes.
	Volumes []Volume
	// Holder, when not empty, says the target needs a job, whose lease is
	// taken for Holder.
	Holder string
	// Why says what the read found, for the decision's log line: the
	// defects, the missing paths, or that nothing needs a job and why.
	Why string
	// Defects are the defects the read found.
	Defects []heal.Defect
	// Revisit, when not zero, is when a decision deferred now (a grace, a
	// backoff) may be taken: the loop plans the target again then
	// instead of waiting for its tick.
	Revisit time.Time
}
