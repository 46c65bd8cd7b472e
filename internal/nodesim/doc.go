// Package nodesim is test support only: a deterministic simulation of one
// node. It runs the real driver, intent owner, record store, NVMe and
// iSCSI attachers, and the loop (pkg/monitor) with both transports, their
// heal policy, the iSCSI session heal and the reconciliation, keeping the
// node model the driver's health answers read, over the fake NVMe kernel
// (pkg/nvme/nvmetest, changed in place as sysfs is) and the fake iSCSI
// host (pkg/iscsi/iscsitest),
// inside a testing/synctest bubble, under a scheduler that decides every
// interleaving from a seed.
//
// Every operation that changes the node — a record written or deleted, an
// NVMe connect, disconnect or rescan, an iscsiadm command, a sysfs write,
// a mount or unmount — is a seam: the actor (an RPC, a monitor tick) parks
// there until the scheduler lets it through, or crashes the whole process
// there (in-memory state lost, kernel and disk kept; a new process starts
// over the same state directory, half the time in a new mount namespace
// whose copy of every mount has a new ID, as a restarted container's, and
// one restart in four finds a record written by a newer pathmend, as
// after a rollback, until an operator removes it); the CO's first try of each RPC that settles a volume at
// quiescence may be crashed too. Locks the actors wait on are channels, so synctest.Wait
// tells the scheduler when every actor is parked or blocked; actors asleep
// in a poll let bubble time run until one parks or ends. A schedule is its
// seed: the same seed replays the same run (TestSimulationReplays), and a
// failing run prints its seed, the command that replays it and a readable
// trace.
//
// The CO (kubelet) sends NodeStage, NodeUnstage, NodePublish and
// NodeUnpublish to five volumes — two namespaces of one NVMe subsystem,
// one of another, two LUNs of one iSCSI target with CHAP, ext4 — one
// operation per volume at a time, publishing only what it saw staged and
// unstaging only what it does not see published. The scheduler also runs
// monitor ticks, moves the clock, and injects faults: an NVMe port lost
// and back, a controller deleted by the kernel, a namespace disabled and
// enabled on the target, an iSCSI session failed and recovered; someone
// else mounting a tmpfs at a recorded path (a staging path, a
// publication, the kubelet directory above them), on top of the stack
// there or slid under its top, and an operator unmounting it (umount -l
// when something is on it). The mount table (pkg/mounts/mountstest) has
// layers as the kernel's: IDs, parents, devices, roots.
//
// Kernel events are a seam too: the fake kernel and host announce every
// change (pathmend's own included) as the lab's kernel does, the events
// wait in the process's socket, and the scheduler delivers them to the
// loop (Monitor.HandleEvents, an actor like a tick, never beside one):
// all of them, or only the oldest, or none with the loss reported (an
// overflow: the loop reads everything), or all but one dropped without a
// word (the tick must find what it said). Deferred decisions that fall
// due are delivered the same way. A crash loses the socket's events.
//
// Checked after every step: every record but the newer pathmend's parses;
// an acknowledged staged volume loses a live path only to a fault (no RPC
// for it is in flight, so an action for another volume or by the monitor
// would be the cause); every connect, login and new node record happens
// while an attaching or staged record on disk lists its endpoint (so a
// volume whose unstage began or was acknowledged is never connected again
// for its own sake); nothing of a target is torn down while the newer
// pathmend's record names it. At quiescence (faults over, the unreadable
// record removed, the CO settled — it retries until acknowledged, or
// never comes back — and the monitor past the grace, the heal's threshold
// and the intent timeout): the kernel's controllers, sessions and node
// records are exactly those the records need (an attaching record kept
// because its device is in use may keep what it has), every controller is
// live, every staged volume has all its paths, no record is left
// detaching, and one left attaching is in use. Throughout: no foreign
// mount layer is ever unmounted by pathmend; no CHAP secret in any log
// line, at klog's most verbose level; and between steps, kubelet's health
// probes (from a random stream of their own, so a seed's scheduling
// decisions are what they were without them) ask NodeGetVolumeHealth of
// every volume, and every answer must be what a fresh read of the node
// gives at that moment (the same statuses, reasons and live paths) or the
// node model's entry of the volume, read at most the loop's bound (two
// ticks) ago.
//
//	go test ./internal/nodesim -run 'TestSimulation$' -schedules=N [-steps=S] [-first=F] [-seed=X] [-trace]
//	make sim [SIM_SCHEDULES=N] [SIM_STEPS=S] [SIM_FIRST=F]
//
// run N schedules (go test: 200 of 60 steps, under -race in make test;
// make sim: 10,000 of 30 steps without -race, also in make test) in
// parallel across GOMAXPROCS, and end with what they covered and the
// line "N schedules, M violations"; -seed replays one schedule and prints
// its trace on a violation (-trace also on success).
package nodesim
