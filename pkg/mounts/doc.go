// Package mounts reads the node's mount table as layers and unmounts one
// layer, never whatever happens to be on top of a path.
//
// A path can hold a stack of mounts: each mount made at a path that is
// already a mount point goes on top of the one there (its parent is the
// mount below it), a mount can be slid under the top of a stack
// (move_mount(2) MOVE_MOUNT_BENEATH), and a mount at an ancestor hides every mount
// below it. /proc/self/mountinfo lists each mount with its ID, its
// parent's ID, the device number and the root of the filesystem it
// mounts, its mount point, its filesystem type and its source. A Table
// resolves paths the way a lookup does (the visible top of each stack
// along the path) and lists the stack at a path bottom to top, the layers
// hidden there, and the mounts below a path.
//
// It owns: parsing mountinfo (the octal escapes of its paths undone),
// path resolution over the table, the identity of the current mount
// namespace and boot (the scope a mount ID is valid in), and Unmount,
// which unmounts the top of a path only after checking — with statx(2)
// on the path itself, symlinks not followed — that the top is the layer
// the caller decided to unmount. It does not decide whose a layer is:
// pkg/driver does, from the staged-volume records.
//
// Invariants: a Table is a snapshot, never changed after NewTable; paths
// are compared after filepath.Clean and never resolved through the file
// system here (the caller resolves symlinks it trusts).
package mounts
