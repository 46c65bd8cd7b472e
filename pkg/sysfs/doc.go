// Package sysfs reads the kernel's state from a sysfs tree rooted at a
// path. The fixture format pathmend's tests load real captures with, and
// the tooling that lays fixtures out and changes them as the kernel does,
// are in package sysfstest: nothing of them is in the production binary.
//
// FS is the one rooted reader every transport uses: "/sys" on a node, a
// materialized fixture in tests. Paths are relative to the root
// ("class/nvme/nvme0/state") and cannot escape it. ReadAttr is for
// required attributes (a missing one is an error naming its path),
// ReadOptionalAttr for attributes a kernel may not publish; values lose
// their trailing newline, NULs and space padding (an NVMe model is padded
// to 40 bytes), and one attribute is read with one bounded read (a page).
// AttrReader does the same through reused buffers for passes over
// thousands of attributes, and opens a Dir: a directory held open for a
// pass, whose Identity (device, inode, mtime of one statx) tells it apart
// from any directory that later takes its name (why that is sound on
// kernfs: Identity, docs/performance.md), whose Names come back sorted
// and as the previous slice when nothing changed, and whose attributes
// are read with openat relative to it. Counts says how many reads,
// listings and stats a reader made. WriteAttr writes a value in one write(2) and
// never creates a file: delete_controller, rescan_controller and
// class/scsi_host/hostH/scan go through it, so a test sees exactly what
// was written. Those writes can block for as long as the kernel object is
// wedged; BoundedWriter runs them with a deadline (ErrWriteTimedOut) and
// never lets a second write to the same attribute join a blocked one.
//
// The package holds no policy and starts no process.
package sysfs
