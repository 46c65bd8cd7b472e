//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lab is where the guest finds the share: binaries in bin/, the helper
// library in guest/. PATHMEND_LAB is set by hack/lab/guest/e2e.sh.
type lab struct {
	dir string
}

// needLab skips outside the lab guest.
func needLab(t *testing.T) lab {
	t.Helper()
	dir := os.Getenv("PATHMEND_LAB")
	if dir == "" {
		t.Skip("PATHMEND_LAB not set: e2e tests run inside the lab guest (make e2e)")
	}
	if os.Geteuid() != 0 {
		t.Skip("e2e tests need root in the lab guest")
	}
	return lab{dir: dir}
}

func (l lab) bin(name string) string { return filepath.Join(l.dir, "bin", name) }

// sh runs a bash script with the target helper library sourced and fails
// the test, showing the script's output, if it exits non-zero. It returns
// standard output with surrounding space trimmed.
func (l lab) sh(t *testing.T, script string) string {
	t.Helper()
	out, err := l.trySh(t, 5*time.Minute, script)
	if err != nil {
		t.Fatalf("guest script failed: %v\n--- script\n%s\n--- output\n%s", err, script, out)
	}
	return out
}

// trySh is sh without failing the test.
func (l lab) trySh(t *testing.T, timeout time.Duration, script string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := "set -euo pipefail\n. " + filepath.Join(l.dir, "guest", "targets.sh") + "\n" + script
	cmd := exec.CommandContext(ctx, "bash", "-c", full)
	cmd.Env = append(os.Environ(), "LAB_BIN="+filepath.Join(l.dir, "bin"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := strings.TrimSpace(stdout.String())
	if err != nil {
		return out + "\n" + stderr.String(), err
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("guest script stderr:\n%s", s)
	}
	return out, nil
}

// teardownAll registers a cleanup that removes every target, connection,
// session and fault the helpers can create, and runs it once now so the
// test starts from an empty node.
func (l lab) teardownAll(t *testing.T) {
	t.Helper()
	l.sh(t, "lab_teardown_all")
	t.Cleanup(func() {
		if out, err := l.trySh(t, 5*time.Minute, "lab_teardown_all"); err != nil {
			t.Errorf("teardown: %v\n%s", err, out)
		}
	})
}
