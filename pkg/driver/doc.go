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
// with the monitor and the iSCSI heal) admits one RPC per volume (a second
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
// NodeGetStorageHealth adds the node's conditions (Deps.NodeConditions).
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
