//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Reading the node while it changes. A whole-node read walks many sysfs
// objects one after the other; one the kernel removes meanwhile (a
// session being logged out, a controller being deleted) makes the read
// fail with ENOENT, and one being set up or torn down can read as
// transient nonsense (target_id "-1" was seen) that the readers refuse.
// Neither is the state a test asserts on: the object is gone, or about to
// be. These read again until a read succeeds — the next one no longer
// meets the object half there — each reread recorded with its cause; a
// read that keeps failing for readLimit fails the test.

// readLimit bounds the rereads of one read: a removal takes milliseconds
// to seconds in the lab, loaded or not.
const readLimit = 30 * time.Second

// readISCSI reads the node's iSCSI state (pkg/iscsi's reader).
func readISCSI(t *testing.T, sys sysfs.FS) *iscsi.Snapshot {
	t.Helper()
	return readAgain(t, "iSCSI state", func() (*iscsi.Snapshot, error) { return iscsi.Read(sys, time.Now()) })
}

// readNVMe reads the node's NVMe state (pkg/nvme's reader).
func readNVMe(t *testing.T, sys sysfs.FS) *nvme.Host {
	t.Helper()
	return readAgain(t, "NVMe state", func() (*nvme.Host, error) { return nvme.Read(sys) })
}

// readAgain calls read until it succeeds, every 100 ms for readLimit.
func readAgain[T any](t *testing.T, what string, read func() (T, error)) T {
	t.Helper()
	start := time.Now()
	for {
		v, err := read()
		if err == nil {
			return v
		}
		if time.Since(start) > readLimit {
			t.Fatalf("read %s: %v (still failing after %s of rereads)", what, err, readLimit)
		}
		reread(t, "read "+what+": "+err.Error())
		time.Sleep(100 * time.Millisecond)
	}
}
