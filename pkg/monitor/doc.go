// Package monitor keeps every path of every staged volume healthy for the
// volume's whole life.
//
// One loop per node ticks every --monitor-interval (default 3 s) plus
// jitter. Each tick:
//
//  1. reads the records through the intent owner (pkg/intent) — the
//     monitor keeps no other intent, so a restarted plugin heals in its
//     first tick — and sysfs once through the nvme.Reader it keeps across
//     ticks (nvme.ScopePaths: what can change and what decisions use is
//     read every tick, what is fixed for an object's life once per object;
//     docs/performance.md), with one nvme.Index of it for the per-volume
//     lookups, and plans without a lock which targets need work: an
//     interrupted intent to finish, a defect, a missing path of a staged
//     volume that is not backed off (or is, for not answering);
//  2. starts one job per such target with the target's lease (intent
//     Owner.Go: at most one job per target, a bounded number in all, never
//     waiting for a target an RPC holds — that one is noted busy);
//  3. reads the jobs that finished (with a synchronous runner, its own).
//
// A job, under the lease, re-reads the target's records and sysfs
// (through the same Reader) and decides again:
//
//  1. finishes interrupted intents (intent.Reconciler);
//  2. heals: nvme.Inspect → heal.Policy → nvme.Repairer; while a record
//     that may be the target's cannot be read, every teardown is refused;
//  3. subtracts the controllers the heal just tore down, so their
//     endpoints count as missing;
//  4. reconnects optimized endpoints, then non-optimized ones, of staged
//     volumes only (an attaching one is its NodeStage's, a detaching or
//     gone one is never reconnected): an endpoint with no present
//     controller (any state but deleting or dead) is probed (TCP, short
//     timeout) and connected within a per-connect timeout. What costs is
//     backed off exponentially (capped by BackoffMax, reset on success):
//     a probe that got no answer, a connect that failed. A refusal costs
//     one round trip and is retried every tick; an endpoint backed off for
//     silence gets a job every tick that rechecks it with a probe bounded
//     by RecheckTimeout. So a returned endpoint is reconnected on the tick
//     after it answers. Endpoints that do not answer are noted for
//     NodeConditions (the driver's NodeGetStorageHealth);
//  5. aligns the timeouts of the staged volumes' controllers with the
//     volumes' (nvme.TimeoutsOf; Linux 6.1 lets them change on a live
//     controller) and sets delayed_removal_secs of their heads where the
//     kernel has it — repair mode only. The tick plans this from what
//     jobs aligned (each controller instance once), so a steady tick
//     starts no job for it and reads no timeout.
//
// After reading the finished jobs, the tick (with its last read):
//
//  1. keeps, per target, the endpoints that do not answer and still have
//     no controller;
//  2. runs the iSCSI session heal, when built in;
//  3. compares the device each staged volume's users hold (Deps.Staged:
//     the driver reads the mount table) with the devices the volume has
//     in this tick's reads — its head's number, its LUN's disks and map
//     (Deps.Sessions, when it is a SessionDevices) — for the
//     pathmend_volume_staged_device_replaced metric; this check reads no
//     sysfs in a steady tick.
//
// Repair comes before reconcile on purpose: a reconcile-first tick would
// diagnose a controller created microseconds earlier, one that has not
// attached its namespace yet (indistinguishable from one that never will),
// tear down the path it just made and leave the volume a path short until
// a later tick. TestTick_RepairsFirstAndReconnectsInTheSameTick pins it.
//
// In observe mode the monitor diagnoses, decides and reports but neither
// tears down nor connects; in off mode it does nothing.
package monitor
