// Package testneed is the one way a pathmend test skips for a missing
// tool or privilege. Locally (a developer without root, without
// promtool) such a test skips with a clear reason. Under CI=true it
// fails instead: .ci/run installs every tool the suite needs and runs as
// root, so a skip there would be a check that silently did not run.
//
// Skips that are not about the machine (an opt-in suite such as
// PATHMEND_SANITY, -short) use t.Skip directly.
package testneed

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI: CI=true (as .ci/run and most
// CI systems set it).
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip skips t with the reason, or fails it under CI.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true: %s (a CI run installs every tool and runs as root; see .ci/run)", reason)
		return
	}
	t.Skip(reason)
}

// Root skips (fails in CI) unless the process runs as root; why says
// what needs it.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "%s needs root", why)
	}
}

// Tools skips (fails in CI) unless every named command is on PATH, and
// returns their paths in order. pkg names the Debian package of each
// command for the message when it differs from the command.
func Tools(t testing.TB, pkg map[string]string, names ...string) []string {
	t.Helper()
	paths := make([]string, len(names))
	for i, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			from := ""
			if pkg[n] != "" {
				from = " (Debian package " + pkg[n] + ")"
			}
			Skip(t, "needs %s%s: %v", n, from, err)
		}
		paths[i] = p
	}
	return paths
}
