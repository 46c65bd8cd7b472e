package model

import (
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// What a transport and the loop say to each other in one tick. The loop
// (pkg/monitor) declares the interface it drives; these are the values
// that cross it, so that a transport needs this package and not the
// loop's.

// Round is one tick of the loop as a transport sees it.
type Round struct {
	// Listing is the staged-volume records of the node, every state, as
	// the tick read them (the unreadable ones too).
	Listing volume.Listing
	// ListErr is set when the records could not be listed at all:
	// nothing owned is planned, and no target is treated as foreign.
	ListErr error
	// Owned and Foreign are the scopes the loop covers: the targets a
	// record names (the node plugin's) and the others (companion mode's).
	Owned, Foreign bool
	// Stamp is the stamp of the tick's reads.
	Stamp Stamp
}

// Work is a target that needs a job this tick, and the holder its lease
// is taken for (what a busy RPC is told).
type Work struct {
	Target volume.Target
	Holder string
}

// Plan is what a transport read and decided at the start of a tick.
type Plan struct {
	// Work lists the targets that need a job.
	Work []Work
	// Defects are the defects the read found (for the tick's report).
	Defects []heal.Defect
	// Skipped lists what was left alone without a job, and why.
	Skipped []string
	// Events are what the read changed in what the transport remembers
	// (an endpoint learned, given up, forgotten).
	Events []string
}

// Result is what one job on one target did.
type Result struct {
	Target   volume.Target
	Outcomes []heal.Outcome
	// Connects lists the endpoints connected, "nqn endpoint".
	Connects []string
	// Skipped lists what the job left alone and why.
	Skipped []string
	// Notes are what the job decided about each volume, by volume ID.
	Notes map[string][]string
	// Changed is set when the job changed the kernel's state.
	Changed bool
}

// Jobs is what became of a transport's Work by the end of the tick: the
// jobs that finished since the last tick (its own, with a synchronous
// runner), and the targets whose lease another holder had.
type Jobs struct {
	Done []Result
	Busy map[volume.Target]string
}

// Report is what a transport makes of its tick once the loop read the
// jobs: the volumes it covers as they are now (read again when a job
// changed the kernel), with the notes of the tick; the node's conditions
// (targets that do not answer, sessions that cannot be kicked); the
// defects it counts; and verdicts decided outside the jobs.
type Report struct {
	Volumes  []Volume
	Node     []volume.Condition
	Defects  map[heal.Kind]int
	Outcomes []heal.Outcome
}
