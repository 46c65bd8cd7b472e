// Package sysfstest is test support only: the fixture format pathmend's
// tests load real sysfs captures with, and the tooling that lays a
// fixture out below a directory and changes it the way the kernel changes
// sysfs. Production code reads sysfs through package sysfs and never
// imports this one.
//
// The format (fixture.go) is text: one entry per line — dir (with its
// age: capture time minus mtime, because pathmend takes a controller
// directory's mtime as its creation time), file (value), wo (write-only
// attribute), err (unreadable attribute, e.g. ENOTCONN) and link (symlink
// text). Materialize recreates a fixture below a directory with modes,
// links and mtimes (now minus age). Fixtures are captured from real
// kernels by hack/capture-sysfs; none is written by hand. Sync (and Tree,
// which holds a materialized fixture) changes a materialized tree into
// another fixture the way the kernel changes sysfs: attributes rewritten
// in place, a re-created object built anew with new inode numbers,
// directory times left alone; Replace swaps a whole tree, as a reboot
// would. They are for tests of readers that remember (sysfs.Identity).
package sysfstest
