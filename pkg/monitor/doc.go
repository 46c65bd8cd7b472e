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
//     within a per-connect timeout, at most MaxConnects at once; an
//     endpoint that does not answer is backed off exponentially (capped,
//     reset on success) and reported, not retried every tick;
//  6. runs the iSCSI session heal, when built in.
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
