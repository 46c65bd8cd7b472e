package intent

import (
	"fmt"
	"os"
	"testing"

	"github.com/pathmend/pathmend/pkg/volume"
)

// writeFuture writes a record of volumeID on target t as a newer
// pathmend would: a version this one does not read.
func writeFuture(t *testing.T, s *volume.Store, volumeID string, tgt volume.Target) {
	t.Helper()
	data := fmt.Sprintf(`{"version": %d, "volumeID": %q, "state": "staged", "context": {"transport": %q, "nvme": {"nqn": %q}}}`,
		volume.RecordVersion+1, volumeID, tgt.Transport, tgt.Name)
	if err := os.WriteFile(s.RecordPath(volumeID), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeGarbage writes a record file of volumeID that is not JSON.
func writeGarbage(t *testing.T, s *volume.Store, volumeID string) {
	t.Helper()
	if err := os.WriteFile(s.RecordPath(volumeID), []byte("\x00\x00garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
}
