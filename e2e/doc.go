//go:build e2e

// Package e2e holds pathmend's end-to-end tests. They run inside the lab
// guest (hack/lab), as root, against real kernel targets: nvmet and LIO
// driven through configfs on the guest's loopback, the NVMe-oF/TCP and
// iSCSI initiators of the same kernel, and the pathmend binary serving
// CSI on a unix socket.
//
// Build and run them with `make e2e` (all) or `make e2e E2E_RUN=TestName`;
// the host builds this package with `go test -c -tags e2e`, boots the
// guest, runs the binary there with -test.v and fails if any test failed.
// Outside the guest (PATHMEND_LAB unset) every test skips.
//
// Each test builds its own targets with the guest helper library
// (hack/lab/guest/targets.sh) and tears everything down in t.Cleanup, so
// tests are independent and run one at a time (never t.Parallel: they
// share one kernel, and lab_teardown_all, iscsid, multipathd, the target
// ports and the iptables chain are node-wide). A later transport scenario
// is one more test here.
//
// How a test waits (wait_test.go, ticks_test.go, read_test.go): for the
// event it asserts — a sysfs state, a record in pathmend's log, a verdict
// — with eventually, whose limit is a safety net far above anything the
// lab has shown, never with a sleep that guesses how long something takes.
// A property in time ("reconnected within two ticks", "kicked at the
// first tick past the threshold") is counted in pathmend's monitor ticks
// ("Monitor tick" at -v=4) from its own log: a loaded guest runs ticks
// late, not more of them. Whole-node sysfs reads go through readISCSI and
// readNVMe, which read again when an object vanishes while it is read. A
// step made again because an attempt lost a race the test cannot control
// calls retried: the run's summary lists it as a finding, not a pass.
package e2e
