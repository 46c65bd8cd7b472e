package main

import (
	"runtime/debug"
	"testing"

	"github.com/pathmend/pathmend/deploy"
)

// TestDevVersion: an unstamped build names the release it leads to and
// the commit it was built from, never the release alone.
func TestDevVersion(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}}
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		want     string
	}{
		{"clean commit", append(rev, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "v0.3.0-dev+0123456789ab"},
		{"dirty tree", append(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "v0.3.0-dev+0123456789ab.dirty"},
		{"no VCS information", []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, "v0.3.0-dev+unknown"},
	} {
		if got := devVersion("v0.3.0", tc.settings); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestBuildVersion_StampedWins: a stamped version is reported as it is;
// an unstamped test binary reports deploy/VERSION as a development build.
func TestBuildVersion_StampedWins(t *testing.T) {
	saved := version
	t.Cleanup(func() { version = saved })
	version = ""
	if got, want := buildVersion(), deploy.Version+"-dev+"; len(got) <= len(want) || got[:len(want)] != want {
		t.Errorf("unstamped build reports %q, want %s<commit>", got, want)
	}
	version = "v9.9.9"
	if got := buildVersion(); got != "v9.9.9" {
		t.Errorf("stamped build reports %q", got)
	}
}
