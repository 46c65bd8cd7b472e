// Package fshealth reads the health of a staged volume's filesystem from
// what the kernel publishes about it: whether the filesystem still takes
// writes, or has shut down, or has recorded errors.
//
// A path outage longer than the kernel queues I/O for ends in write errors
// the filesystem cannot hide: ext4 aborts its journal and stops writing
// ("Remounting filesystem read-only"), XFS shuts down. When the paths come
// back, the paths are healthy and the filesystem is not: it stays that way
// until it is unmounted, checked and mounted again. This package tells.
//
// # Sources, and why these
//
//   - The mount table (/proc/self/mountinfo, read by the caller once per
//     refresh): a staging mount, or its superblock, that shows "ro" on a
//     volume staged read-write. Kernels that remount ext4 read-only after
//     an error by setting the superblock's read-only flag show it here.
//     The Debian 6.1 kernel does not: after "Remounting filesystem
//     read-only" its mount table still says rw for the mount and the
//     superblock, and every write fails with EROFS (measured in the lab),
//     so the mount table alone misses it.
//   - ext4's error record in sysfs, fs/ext4/<dev>/: errors_count (the
//     superblock's s_error_count: every ext4_error since the filesystem
//     was last checked, kept on disk across mounts), first_error_time,
//     first_error_func, last_error_time, last_error_func. The directory is
//     named by the kernel's name of the block device (nvme0n1, dm-2), found
//     from the mount's device number through dev/block/<major:minor>.
//     A count above zero is positive evidence of an error; with
//     errors=remount-ro (the behaviour pathmend stages ext3 and ext4 with
//     unless the mount flags name another) every error has made the
//     filesystem read-only. The behaviour in force is read from
//     /proc/fs/ext4/<dev>/options, which lists every option including the
//     defaults (the mount table shows errors= only when it differs from
//     the superblock's default), and only when there is an error to grade.
//   - XFS publishes no shutdown flag in sysfs; a shut-down XFS answers EIO
//     to a stat of any of its inodes (xfs_vn_getattr checks the shutdown
//     state before it reads anything), so the reader stats the staging
//     mount's root. That stat reads the in-memory inode only: it does not
//     wait for a path.
//
// The kernel log ("EXT4-fs error", "Filesystem has been shut down") says
// the same in words. pathmend does not read the kernel log in production:
// parsing free text for state the kernel publishes positively would be
// the weaker source, and the state above survives a restart of pathmend,
// while a log line may have scrolled away.
//
// # What it does not do
//
// It never writes to a filesystem, never remounts one and never runs a
// program: a filesystem that recorded errors must be checked before it is
// written again, and that happens at the next NodeStage (pkg/driver).
// Block volumes have no filesystem and are never read. A volume staged
// read-only on purpose is not a defect: its read-only mount is what was
// asked for.
//
// # Invariants
//
//   - A missing errors_count on a mounted ext4 is an error naming the
//     path (State Unknown), never "no errors".
//   - Reads are per volume and bounded: three or four sysfs attributes and
//     one stat; the options file only when errors are recorded.
//   - Health values are snapshots; the package keeps nothing between calls.
package fshealth
