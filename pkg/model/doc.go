// Package model is the node model: the actual state of every path
// pathmend cares about, kept by the one loop (pkg/monitor) and read by
// everything that answers for it — NodeGetVolumeHealth, the health check
// of NodeGetVolumeStats, NodeGetStorageHealth, /healthz and the metrics —
// so that answering for one volume never reads the whole node.
//
// # What it holds
//
// One Volume per staged volume (scope Owned: a staged-volume record of
// this node plugin names it) and, in companion's foreign scope, per
// learned target (scope Foreign: another driver attached it, pathmend
// learned its endpoints):
//
//   - its expected paths (Path: the endpoint or portal the volume lists),
//     each with the kernel object that serves it (nvme4, session5), its
//     state (live, down, absent), the kernel's words for it, and since
//     when the model has seen it in that state (the model measures it:
//     the kernel publishes no time of a state change);
//   - the block devices its namespace or LUN has now, and the device its
//     users hold (the staging mount's, a publication's), by number;
//   - its condition (healthy, degraded, inaccessible) with reason and
//     message, and the loop's notes about it (a deferred repair, a
//     backed-off endpoint);
//   - facts other packages add (Fact: a filesystem's health, …), each a
//     condition with its own read time, kept under the adder's name;
//   - the time of the kernel read it reflects (Volume.ReadAt) and the
//     generation that last changed it.
//
// Besides volumes: the node's conditions per source (targets that do not
// answer, sessions the heal cannot kick), the end of the last tick
// (/healthz), and a generation number that grows with every change.
//
// It holds no decision and knows no transport: the transports
// (pkg/nvme/nvmeheal, pkg/iscsi/iscsiheal) turn their reads into Volumes,
// the loop writes them, the driver reads them.
//
// # Writing: one writer, ordered by read
//
// Every write goes through Model.Update, which runs one transaction (Txn)
// at a time and publishes its result as a new Snapshot. The loop is the
// writer of paths, devices, conditions, notes and node conditions; a fact
// source writes its facts; a targeted refresh (one target's kernel
// objects, read because an event named them) writes through the same
// Update. A write never replaces what a newer read found: a reader takes a
// Stamp (Model.Stamp) before it reads the kernel and writes with it, and
// Txn.Put keeps an entry whose stamp is newer. So a tick's long read and
// a targeted read of one target that began after it may commit in either
// order, and the model keeps the newer. Txn.Sweep drops the entries a full
// read did not see, except those a newer read wrote.
//
// Extending a volume with facts of another kind (a filesystem-health
// condition of a staged filesystem volume, say) needs no change here:
//
//	m.Update(func(tx *model.Txn) {
//		tx.SetFact(volumeID, "filesystem", model.Fact{Condition: c, ReadAt: now})
//	})
//
// A fact is kept while its volume is (a Put keeps the facts it does not
// carry); Volume.Conditions returns them after the path condition, so
// NodeGetVolumeHealth reports each abnormal one as an entry of its own,
// and NodeGetStorageHealth counts them per reason.
//
// A targeted refresh needs to know which target a kernel object serves:
// Snapshot.TargetOf answers for every object a Volume names (controllers,
// sessions, block devices) and every target. The loop offers the refresh
// itself as a Refresher: the transport reads only the objects of that
// target (one NVMe subsystem with its controllers and heads, one iSCSI
// target's sessions with their LUNs and maps) and the loop writes what it
// read of that target's volumes.
//
// # Reading: snapshots, never blocked
//
// Model.Snapshot returns the current Snapshot with one atomic load; a
// reader never takes the write lock and never waits for a tick. A
// Snapshot is a value: nothing in it changes after it is published
// (slices and maps in it are shared with later snapshots and must not be
// mutated by readers). A reader that needs a bounded age compares
// Volume.ReadAt with its bound (Snapshot.Fresh); the driver refreshes only
// that volume's own kernel objects when its entry is older than the bound
// or missing (docs/architecture.md states the bound).
//
// # Invariants
//
//   - A Snapshot never changes; Generation grows with every Update that
//     changes something, and Volume.Gen is the generation that last
//     changed the volume.
//   - An entry is replaced only by a read that began after the read it
//     reflects (Stamp order).
//   - Path.Since is the ReadAt of the first read that saw the path in its
//     current state (and object); it survives ticks that see no change.
//   - The package starts no goroutine, reads no clock and touches no
//     kernel object: times come with the writes.
package model
