// Package uevent receives the kernel's uevents: the announcements the
// kernel multicasts on the NETLINK_KOBJECT_UEVENT socket whenever a
// device is added, removed or changed — an NVMe controller deleted or
// reconnected ("change" with NVME_EVENT=connected), a namespace head
// gone or back, an iSCSI session or SCSI disk removed, a dm map loaded
// or a path of it failed. pathmend uses them as hints: an event makes the
// loop read the objects it names at once instead of at the next tick;
// the decision is still made on that read.
//
// # What it owns
//
//   - Parse: one message as the kernel sends it ("ACTION@DEVPATH\0" and
//     "KEY=value\0" pairs), bounded (MaxMessage, MaxKeys), with every key
//     kept; udev's re-broadcast frames are refused (ErrNotKernel). Fuzzed.
//   - Objects: the kernel objects an event's DEVPATH names — NVMe
//     controller, subsystem, leg; iSCSI session and connection; SCSI host
//     and device; block device (head, disk, dm map) — so a listener can
//     find the target they serve. Relevant: the events that may change a
//     path pathmend keeps.
//   - Dial: the netlink socket, bound to the kernel's group (1), never
//     udev's (2): no udev is needed, no process is started. Read through
//     the runtime's poller: an idle listener costs no CPU and no thread.
//   - Source: one goroutine receiving into a bounded queue, and batches
//     for one consumer. Nothing blocks the socket: when the socket's
//     buffer overflowed (ENOBUFS), the queue was full, or a message could
//     not be read, the next batch says events were Lost (and why), the
//     queued events are dropped, and Metrics counts the loss: the
//     consumer reads everything again, as its periodic tick would.
//
// # What it does not
//
// It decides nothing and reads no sysfs: which target an object serves is
// the model's and the transports' to say (pkg/model Snapshot.TargetOf).
// It does not order or deduplicate events beyond the kernel's order, and
// does not treat a gap in SEQNUM as a loss: the kernel numbers the
// events of every network namespace in one sequence but sends a listener
// only those of its own.
//
// Which events the 6.1 kernel sends for each path fault, measured in the
// lab, and which faults only the tick finds: docs/uevents.md and
// docs/performance.md.
package uevent
