// Package driver serves pathmend's CSI Identity and Node services.
//
// It owns the gRPC surface: the door (door.go: every request held to the
// CSI size limits and the path rules, --kubelet-root, before any handler),
// argument checks, the one volume-context parser call (volume context and
// publish context together), the one error-to-status mapping (ToStatus)
// and the logging interceptor with its redacted, bounded request dump
// (redact.go), which hands every secret of a request to the process's
// scrubber (pkg/scrub) before anything runs and scrubs every answer. It
// owns the node-side lifecycle of a volume: attach through
// the transport's Attacher, format and mount at the staging path, bind
// mounts at target paths, stats, condition and online expansion. Just
// before it formats and mounts a staged device (and again when the mount
// fails; for raw block, before it records the volume staged) it asks an
// Attacher that implements DeviceChecker whether the device is still the
// one to use, and records the device that took its place.
//
// The node's intent is not its own: the intent owner (pkg/intent, shared
// with the loop's jobs) admits one RPC per volume (a second
// is Aborted), leases targets, and keeps the records. NodeStage writes an
// attaching record under the target's lease before the first connect or
// login and passes the target's co-tenants to the attach; NodeUnstage sets
// the record detaching under the lease before the first teardown and
// refuses (FailedPrecondition naming the file) while a record that may be
// the target's cannot be read. docs/state.md has the state machine.
//
// It does not know how a transport attaches: the nvme-tcp and iscsi
// Attachers are injected, chosen by the "transport" key of the volume
// context. It keeps no state in memory; everything a restarted plugin
// needs comes from the records on disk and from the kernel.
//
// A staged volume's device is known by number, not name: the record keeps
// the number it was staged with (checked against the device node), and the
// device its users hold is read from the mount table (Deps.MountInfo) or
// the device node at a block publication. When that is not one of the
// devices the transport finds for the volume now (Condition.Devices), the
// kernel removed the device and made a new one (staged_device.go): the
// volume is INACCESSIBLE, StagedDeviceReplaced, in health and storage
// health, NodeGetVolumeStats answers FailedPrecondition, and NodeStage
// restages it when no publication holds the old mount (restage.go).
//
// Health is read from the node model (pkg/model) the loop keeps: while a
// volume's entry is at most Config.HealthBound old (the loop's bound, two
// ticks), NodeGetVolumeHealth, the check of NodeGetVolumeStats and
// NodeGetStorageHealth answer from it — its condition, the loop's notes,
// the facts other packages added; an older or missing entry makes the
// RPC read that volume's own kernel objects through its Attacher's Health
// (its subsystem, or its target's sessions) and the mount table, never
// the whole node, and leaves the model to the loop. NodeGetStorageHealth
// adds the node's conditions from the model.
//
// Filesystem health (pkg/fshealth) is a fact of the volume's entry: the
// loop reads every staged filesystem each tick through FilesystemHealth
// (the mount table once) and writes the abnormal ones (read-only after
// errors, shut down, errors recorded), which NodeGetVolumeHealth reports
// as an entry of its own, NodeGetStorageHealth counts per node and
// NodeGetVolumeStats answers FailedPrecondition for. A fact read before
// the volume was staged as it is now is not its answer. pathmend never
// remounts a damaged filesystem read-write in place: NodeStage (and
// NodePublish, when no pod holds the volume) unmounts it, checks it
// (fscheck.go: ext fsck -p before every read-write mount of an existing
// filesystem, failing the stage on errors left; XFS by its mount, with
// xfs_repair only under Config.XFSRepair) and mounts it again.
//
// No RPC waits in the kernel for a path (stall.go, kernel_calls.go): a
// call that would write to a read-write filesystem with no live path (an
// unmount, a statfs, a grow) is not started — the RPC answers Unavailable
// naming since when every path is down, the unwritten data and when the
// kernel stops queueing — and one that still blocks (a path lost during
// it) is waited for at most Config.KernelCallTimeout, then answered
// Aborted with the volume busy until it returns.
//
// Mounts are owned by layer (layers.go): the record names each mount
// the driver made (Deps.MountInfo reads the table, Deps.MountNamespace
// says which namespace of which boot its IDs are valid in), and only
// those are unmounted, one checked layer at a time (Deps.UnmountLayer);
// any other layer at, on, under, inside or over a volume's path is
// FailedPrecondition naming it.
//
// Invariants: every argument is validated before the host is touched; a
// request over a CSI limit reaches no handler; a failed NodeStage removes
// what it created and nothing that existed before it (or keeps its
// attaching record when it cannot); a record that says what may exist is
// on disk whenever the kernel has something of a volume, mounts included
// (a mount's layer is recorded before the mount); a failure after a
// mount undoes it before the answer; no layer that is not the volume's is
// ever unmounted, no path removed that NodePublish did not create; a
// target lies strictly below the kubelet root and apart from the staging
// path; secrets, and the value of every credential key in any map, never
// reach a log line or an error; no error repeats more than 64 bytes of a
// caller's value or key.
package driver
