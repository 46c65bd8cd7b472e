// Package nodesim is test support only: a deterministic simulation of one
// node. It runs the real driver, intent owner, record store, NVMe and
// iSCSI attachers, monitor and reconciliation over the fake NVMe kernel
// (pkg/nvme/nvmetest) and the fake iSCSI host (pkg/iscsi/iscsitest), inside
// a testing/synctest bubble, under a scheduler that decides every
// interleaving from a seed.
//
// Every operation that changes the node — a record written or deleted, an
// NVMe connect or disconnect, an iscsiadm command, a sysfs write, a mount
// or unmount — is a seam: the actor (an RPC, a monitor tick) parks there
// until the scheduler lets it through, or crashes the whole process there
// (in-memory state lost, kernel and disk kept; a new process starts over
// the same state directory). Locks the actors wait on are channels, so
// synctest.Wait tells the scheduler when every actor is parked or blocked.
// A schedule is its seed: the same seed replays the same run, and a failing
// run prints its seed and a readable trace.
//
// The actors are NodeStage and NodeUnstage of five volumes (two
// namespaces of one NVMe subsystem, one of another, two LUNs of one iSCSI
// target, mounted ext4 with CHAP on iSCSI) and monitor ticks with the
// reconciliation; the scheduler also crashes the process and moves the
// clock. Checked after every step: every record parses; a volume whose
// NodeStage was acknowledged keeps all its paths (no fault is injected, so
// an action for another volume or by the monitor is the only way to lose
// one); the kernel holds nothing of a target no record names. At
// quiescence (every actor done, the CO's view settled — it retries, or
// never comes back — and the monitor past the grace and the intent
// timeout): the kernel's controllers, sessions and node records are
// exactly those the records need, no record is left detaching, and one
// left attaching is in use. After each schedule: no CHAP secret in any log
// line.
//
// Not yet simulated: NodePublish and NodeUnpublish, kernel faults (paths
// lost, namespaces disabled, sessions failed), the iSCSI session heal and
// unreadable records; those have their own tests.
//
//	go test ./internal/nodesim -run TestSimulation -v -schedules=N [-steps=S] [-seed=X]
//
// runs N schedules (default 30; about 0.1 s each with the state on tmpfs,
// 0.7 s under -race) and ends with the line "N schedules, 0 violations";
// -seed replays one schedule and prints its trace on a violation.
package nodesim
