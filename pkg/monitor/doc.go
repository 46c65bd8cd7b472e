// Package monitor is the loop: the one loop of a pathmend process, which
// keeps the node model (pkg/model) and, through the transports, every
// path of every volume in its scope healthy.
//
// It knows no transport. The transports plug in behind the Transport
// interface it declares (pkg/nvme/nvmeheal, pkg/iscsi/iscsiheal); main
// builds them and hands them over. Each tick (every Config.Interval,
// default 3 s, plus up to 20 % jitter):
//
//  1. reads the records through the intent owner (pkg/intent) — the loop
//     keeps no other intent, so a restarted plugin heals in its first
//     tick — and takes the model's stamp for the tick's reads;
//  2. asks every transport to Plan: read its kernel state once (the
//     transports keep readers that read what cannot change once per
//     kernel object; docs/performance.md) and say which targets need a
//     job; in the owned scope it adds the targets with an interrupted
//     intent to finish (intent.Reconciler);
//  3. starts one job per such target with the target's lease (the
//     owner's Go: at most one job per target, a bounded number in all,
//     never waiting for a target an RPC holds — that one is noted busy).
//     The job finishes the target's interrupted intents (owned scope),
//     then runs the transport's Job, which re-reads under the lease and
//     decides again. The tick does not wait for its jobs: it reads the
//     ones that finished (with a synchronous runner, its own);
//  4. asks every transport to Finish: the volumes of the tick's scopes as
//     they are now (read again only when a job changed the kernel), the
//     node's conditions, the defects and verdicts decided outside jobs;
//  5. compares the device each staged volume's users hold (Deps.Staged:
//     the driver reads the mount table, once) with the devices the
//     volume has now — by number — and marks a volume whose device the
//     kernel replaced (StagedDeviceReplaced);
//  6. writes all of it into the model in one Update (entries the tick did
//     not write leave it, unless a later read wrote them), and sets the
//     metrics from it: paths per volume, staged device replaced,
//     defects, verdicts, the tick's duration.
//
// # Scopes
//
// Companion mode is a scope, not a loop of its own. Config.Scope says
// which targets the loop covers: Owned (the node plugin's: every target a
// staged-volume record names; interrupted intents are finished, staged
// volumes kept), Foreign (targets no record names: the NVMe transport
// heals what it learned of them, pkg/companion; the iSCSI heal kicks
// their sessions), or both (serve --heal-foreign). `pathmend companion`
// runs this same loop with the foreign scope and no CSI server.
//
// # Bound
//
// While the loop runs, no entry of the model is older than Config.Bound:
// two ticks, jitter included (7.2 s by default). The driver answers a
// health RPC from the model within that bound and reads the volume's own
// kernel objects beyond it. RefreshTarget reads one target's objects
// only (a kernel event named one of them: Snapshot.TargetOf) and writes
// them with a stamp of its own, so a tick that began earlier never
// overwrites it.
//
// In observe mode the transports diagnose, decide and report but neither
// tear down nor connect; in off mode the loop starts no job.
package monitor
