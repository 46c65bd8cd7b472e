// Package kmsg reads the kernel's log from /dev/kmsg: every record with
// its sequence number and its time since boot, so a lab tool or an e2e
// test can take a cursor before a step and see exactly what the kernel
// logged after it (an ext4 journal abort, a read-only remount, a failing
// path), and when.
//
// The record format is the kernel's (Documentation/ABI/testing/dev-kmsg):
//
//	<facility*8+level>,<sequence>,<microseconds since boot>,<flags>[,…];<message>
//	 KEY=value            (dictionary lines, after a newline; ignored)
//
// with non-printable bytes of the message escaped as \xNN. One read of
// /dev/kmsg returns one record; a reader whose next record was
// overwritten gets EPIPE once and continues with the oldest record left.
//
// The package is test and lab support only: pathmend itself never reads
// the kernel log (sysfs is its source of truth).
package kmsg
