// Package blockuse tells whether a block device is in use on the node,
// from what the kernel publishes: sysfs and the host's mount table.
//
// A device counts as in use when
//
//   - it, or a partition of it, has holders (block/<dev>/holders, and
//     block/<dev>/<part>/holders): a device-mapper table (LVM, a
//     multipath map, kpartx), an md array, bcache. A holder link is made by
//     the kernel when the stacked device claims the disk, so the disk is
//     open for as long as the holder exists, whether or not anything uses
//     the holder in turn; removing the disk under it leaves the holder
//     failing every I/O. So any holder means in use, without walking up
//     the stack;
//   - a mount's source is it or a partition of it: a mountinfo line whose
//     major:minor is the device's number (block/<dev>/dev) or a
//     partition's;
//   - its device node, or a partition's, is bind-mounted somewhere: a
//     mountinfo line of a devtmpfs whose root is /<dev>. That is how a
//     block-mode volume is published to a pod (NodePublish binds the
//     device node at the pod's path), by kubelet or any CSI driver;
//   - anything above cannot be read (a sysfs read fails, the mount table
//     cannot be read or parsed, more partitions than the bound): when in
//     doubt, in use.
//
// What it cannot see, and why it does not try: a plain open(2) of the
// device node by a process — a database on a raw device path, a dd, an
// exclusive open that is not a stacked device (a swap area, mkfs). Those
// show only in /proc/<pid>/fd of the opener. Walking every fd of every
// process on the node (tens of thousands of readlinks and stats, in the
// host PID namespace, with the privilege to read other processes' fds)
// would still be a snapshot: a process may open the device the moment
// after the walk. The answer would look like a guarantee and not be one,
// so Reader does not walk /proc; callers whose action would take a device
// away from a plain opener must say so in their docs.
//
// The mount table must be the host's: a container's own
// /proc/self/mountinfo does not show the mounts kubelet makes for other
// pods unless the kubelet directory is shared into it. From a container
// in the host PID namespace, /proc/1/mountinfo is the host init's table.
// Mounts made only inside another mount namespace (a privileged pod that
// mounts the disk itself) are not in it.
//
// Reader reads on demand (each InUse call reads the device's few sysfs
// entries and the mount table once) and keeps nothing: callers ask when a
// decision is due, not every tick.
package blockuse
