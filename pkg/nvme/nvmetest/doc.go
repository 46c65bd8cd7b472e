// Package nvmetest writes NVMe sysfs trees for tests: a Topology (which
// subsystems, controllers, namespaces and legs exist, in which states)
// becomes a sysfstest.Fixture laid out exactly like the captures of a Linux
// 6.1 host in pathmend's lab, and Write materializes it in a directory a
// sysfs.FS can be rooted at.
//
// It serves the read-model tests and benchmarks of package nvme, the
// property tests of Inspect and, as a fake kernel, tests of code that
// reacts to sysfs changes: edit the Topology and write it again into a
// fresh directory.
//
// The tree holds what the kernel publishes for NVMe/TCP controllers
// (class/nvme, class/nvme-subsystem, block and devices/virtual/…, with
// the write-only controller attributes as empty mode-0200 files) and
// module/nvme_core/parameters/multipath, at the paths the kernel uses. It
// writes the attributes pathmend reads or writes and leaves out the rest
// (firmware_rev, hostid, dev, the device and subsystem links, block-layer
// tuning, character devices ng0n1): creating files dominates the cost of
// a test, and the real captures cover Read's tolerance of what it skips.
//
// The package imports only pkg/sysfs, so package nvme's own tests can use
// it.
package nvmetest
