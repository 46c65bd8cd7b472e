// Package intent owns the node's attachment intent: which volumes this
// node means to have attached, in which lifecycle state, and who may act
// on each volume and on each target right now.
//
// # What it owns
//
// The Owner is the only code that reads and writes staged-volume records
// (pkg/volume keeps the Record type and the atomic file Store below it).
// NodeStage, NodeUnstage, the loop's repairs and reconnects, the
// reconciliation of interrupted intents and the iSCSI session heal all go
// through it:
//
//   - per volume, Begin admits one operation at a time and refuses a
//     second at once (the driver answers Aborted); the volumes begun are
//     the in-flight registry reconciliation consults;
//   - per target (an NVMe subsystem NQN, an iSCSI target IQN: volume.Target),
//     one lease shared by every actor, taken blocking (Lock, for RPCs) or
//     not at all (TryLock, Go, for the loop's jobs, which never
//     wait on a busy target). One target's holder never delays another:
//     there is no node-wide lock, and a waiter blocks on a channel;
//   - the record state machine: attaching is written under the lease
//     before the first connect or login, staged when NodeStage succeeded,
//     detaching under the lease before the first teardown; the record is
//     removed when the teardown is done. Publication changes and
//     attaching → staged change no co-tenant and need only the volume.
//
// # Co-tenants, fail closed
//
// Under a target's lease, CoTenants are every other record of the target
// in any state, and every record file that may be the target's but cannot
// be read: one whose envelope names the target (a record written by a
// newer pathmend, one that fails a check) or names no target at all (a
// file that is not a record's JSON). While there is one, nothing of the
// target is torn down (volume.CoTenants.Err); a file whose target is
// unknown blocks teardown on every target.
//
// # Reconciliation
//
// The Reconciler finishes what a crash or a failed RPC left: an attaching
// record with no operation in flight for longer than its timeout, whose
// device nothing uses (no mount of it or at its staging path in the mount
// table, no holder in sysfs), is rolled back — set detaching, detached
// through the co-tenant gate, removed — and a detaching record is
// finished the same way. One in use is kept and reported.
//
// # Invariants
//
//   - A record that says what may exist is on disk before the kernel is
//     touched, and removed only after the teardown is done.
//   - Only a lease holder creates a record, sets one detaching or deletes
//     one; so what a lease holder reads of its target stays true until it
//     unlocks.
//   - Nothing is cached: a restarted process needs only the disk.
//   - The package starts no goroutine of its own; jobs run through the
//     injected Runner, time comes from the injected clock.
package intent
