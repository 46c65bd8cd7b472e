// Package attach is pathmend's iSCSI Attacher: the driver's Attacher for
// transport "iscsi", beside pkg/nvme/attach for "nvme-tcp". It speaks
// pkg/volume types only and imports neither pkg/driver (nor gRPC) nor
// the loop; main hands it to the driver.
//
// Attach makes sure a node record exists for every portal of the volume
// (static -o new, or sendtargets discovery), applies the volume's settings
// to each (node.startup manual, login timeout and retries, the replacement
// timeout, CHAP), logs in to all portals in parallel, waits for the LUN's
// disk on each session (scanning exactly that LUN when it lags), checks
// that all disks are one LUN (same wwid where the kernel publishes one —
// by size alone, logged, where it publishes none — and the same size as
// each other and as the map) and returns the
// dm-multipath map over them — waiting a bounded time for multipathd,
// which may map a single path too — or a single disk when multipathd
// assembles none, after checking that the device node's number matches
// sysfs. CheckDevice reads sysfs again when the driver is about to use
// the device: a single disk that a multipath map of the LUN took since
// the attach (multipathd slower than the wait) is replaced by the map;
// a disk anything else holds is refused as unavailable.
// Portals that fail to log in are left to the session heal as long as one
// succeeds. The attachment names what the call created — node records that
// did not exist, portals that had no session before it — also when it
// fails; Undo removes exactly that (flushing the LUN's map first), never a
// session or node record that existed before the call.
//
// Detach flushes the map (multipath -f), deletes the LUN's disks
// (device/delete) and logs out each session of the volume's portals that
// no co-tenant uses, deleting its node record (and the CHAP secrets in
// it). The attacher keeps no intent of its own: co-tenants (every other
// record of the target, attaching, staged or detaching) come with each
// call from the intent owner, whose target lease the caller holds; while
// a record that may be the target's cannot be read, Undo and Detach tear
// nothing down.
//
// Health grades the volume's paths from one sysfs read; Expand rescans the
// LUN's disks and resizes the map.
//
// It reads sysfs through package iscsi's Read only, runs commands only
// through the shared *iscsi.Initiator, writes sysfs through the injected
// Writer and waits on the injected clock.
package attach
