// Package companion holds what the loop's foreign scope expects of the
// NVMe-oF/TCP subsystems another CSI driver connected, beside that
// driver's node plugin: the endpoints it learned and the options to
// connect them again. It has no loop or tick of its own: `pathmend
// companion` is the loop of pkg/monitor in the foreign scope, whose NVMe
// transport (pkg/nvme/nvmeheal) calls Learn with each tick's read and
// heals what was learned; the iSCSI half is the session heal of pkg/iscsi
// with scope foreign.
//
// # What it owns
//
// With no staged-volume record to say what a subsystem should look like,
// expectations come from what the node has shown. For every NVMe/TCP
// subsystem no record of the node plugin names, the NVMe heal learns each
// endpoint it has seen a controller on and the connect options the kernel
// publishes for that controller: the address (traddr, trsvcid,
// host_traddr, host_iface), hostnqn, hostid, ctrl_loss_tmo,
// reconnect_delay, fast_io_fail_tmo, kato, queue_count (nr_io_queues + 1)
// and sqsize (queue_size - 1), read from class/nvme/<ctrl>/ through
// nvme.Read and nvme.ReadConnectParams. What the kernel does not publish
// (digests, tos, write and poll queues) is not learned and not passed.
// DH-HMAC-CHAP keys are never stored: only that the controller held one;
// a reconnect takes the keys from a live controller of the same
// subsystem (nvme.SiblingSecrets), and is refused when none holds them.
//
// Learned subsystems are files under <state-dir>/learned (Store): one per
// NQN, versioned (LearnedVersion), written atomically with mode 0600, and
// only on a change (never once per tick). A file this pathmend cannot read
// — a newer version, corrupt — blocks its subsystem (fail closed). The
// Learner keeps them in memory between ticks, and records what the
// transport tore down (MarkTornDown) and connected again (Reconnected).
//
// # The rule: the kernel gave up, or someone disconnected
//
// Learn keeps, per endpoint, the last controller state seen other than
// deleting and dead. When the endpoint's controller vanishes:
//
//   - last seen connecting or resetting: the kernel gave up on it
//     (ctrl_loss_tmo ran out). The endpoint is kept; when it answers a TCP
//     probe it is connected again with the learned options, backed off
//     exponentially while it does not, each connect bounded;
//   - last seen live (or new): someone disconnected it on purpose (the
//     driver's NodeUnstage, an operator's nvme disconnect). It is
//     forgotten and never connected again.
//
// A subsystem whose endpoints have all been gone for ForgetAfter is
// forgotten. Limits: a disconnect while the controller is reconnecting is
// indistinguishable from a give-up (it is reconnected until the bound);
// a controller that goes from live to gone between two ticks (a
// ctrl_loss_tmo shorter than the tick) reads as a disconnect; and a
// give-up while pathmend was not running reads as a disconnect, since
// the last state it saw was live.
//
// # Repairs
//
// NoNamespace, ControllerNotContributing, AmbiguousHead and StaleEndpoint
// are diagnosed by nvme.Inspect as for staged volumes, and decided by the
// same heal.Policy, in the NVMe transport's one job. Every namespace
// counts as in use (pathmend cannot see another driver's workloads):
// Strand makes a teardown that would leave any namespace of the
// subsystem with no usable path, or remove its last leg, refused as
// co_tenants. What a repair tears down is marked and connected again
// with the learned options.
//
// # One owner per kernel object
//
// A target (subsystem NQN, iSCSI IQN) any staged-volume record of the
// node plugin names, in any state — or that an unreadable record file
// may belong to — is the plugin's; every other one is companion mode's.
// Both read the same state dir (Owner). The foreign scope plans only the
// targets no record names (the plugin's own loop heals its volumes), and
// every action runs as a job under the target's lease, which re-reads
// the records first: a NodeStage that wrote its attaching record after
// the tick planned wins, and the job does nothing (owned_by_node_plugin).
// When the node plugin covers the foreign scope itself (serve
// --heal-foreign), the lease is the same in-process one its RPCs take,
// and such a target is healed as the plugin's from then on.
//
// # Actions
//
// The mode is the policy's (companion mode starts in observe). In repair
// mode each action kind runs only when enabled (Actions); a disabled one
// is decided and reported observed with class action_disabled.
//
// # Invariants
//
//   - Nothing is learned of a subsystem the node plugin owns, of a
//     discovery subsystem, or of a controller first seen being deleted.
//   - An endpoint is connected again only if it was given up by the
//     kernel or torn down by a companion repair; never one someone
//     disconnected while it was live.
//   - Secrets never reach a file, a log line or an error.
//   - The package starts no goroutine and has no loop; time comes with
//     the calls.
package companion
