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
// share one kernel). A later transport scenario is one more test here.
package e2e
