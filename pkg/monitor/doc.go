// Package monitor keeps every path of every staged volume healthy for the
// volume's whole life.
//
// One loop per node ticks every --monitor-interval (default 3 s) plus
// jitter. Each tick:
//
//  1. loads the staged-volume records (pkg/volume) — the monitor keeps no
//     other state, so a restarted plugin heals in its first tick;
//  2. reads sysfs once through the nvme.Reader it keeps across ticks: one
//     snapshot shared by every volume, in nvme.ScopePaths (what can
//     change and what decisions use is read every tick; what is fixed
//     for an object's life once per object; docs/performance.md), and one
//     nvme.Index of it for the per-volume lookups;
//  3. heals: nvme.Inspect → heal.Policy → nvme.Repairer;
//  4. subtracts the controllers the heal just tore down from the snapshot,
//     so their endpoints count as missing;
//  5. reconciles optimized endpoints, then non-optimized ones, per volume
//     concurrently: an endpoint with no present controller (any state but
//     deleting or dead) is probed (TCP, short timeout) and connected
//     within a per-connect timeout, at most MaxConnects at once. What
//     costs is backed off exponentially (capped by BackoffMax, reset on
//     success): a probe that got no answer, a connect that failed. A
//     refusal costs one round trip and is retried every tick; an endpoint
//     backed off for silence is rechecked every tick with a probe bounded
//     by RecheckTimeout. So a returned endpoint is reconnected on the tick
//     after it answers. Endpoints that do not answer are kept, per target,
//     for NodeConditions (the driver's NodeGetStorageHealth);
//  6. aligns the timeouts of the staged volumes' controllers with the
//     volumes' (nvme.TimeoutsOf; Linux 6.1 lets them change on a live
//     controller) and sets delayed_removal_secs of their heads where the
//     kernel has it — repair mode only;
//  7. runs the iSCSI session heal, when built in;
//  8. compares the device each staged volume's users hold (Deps.Staged:
//     the driver reads the mount table) with the devices the volume has
//     in this tick's reads — its head's number, its LUN's disks and map
//     (Deps.Sessions, when it is a SessionDevices) — for the
//     pathmend_volume_staged_device_replaced metric. Aligning timeouts
//     and this check read no sysfs in a steady tick.
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
