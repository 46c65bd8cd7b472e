package main

import (
	"runtime/debug"

	"github.com/pathmend/pathmend/deploy"
)

// version is stamped at build time by `make build` and the image build
// (hack/version.sh): -ldflags "-X main.version=v0.1.0" for the release
// commit, "v0.1.0-dev+<commit>" for any other. Empty when a build did not
// stamp it (plain `go build`): buildVersion derives it then.
var version string

// buildVersion is the version pathmend reports (`pathmend version`, the
// "Serving CSI" line, the CSI plugin info): the stamped one, or else
// deploy/VERSION (the release this source leads to) marked as a
// development build of the commit Go recorded, so an unstamped build
// never claims to be a release.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return devVersion(deploy.Version, nil)
	}
	return devVersion(deploy.Version, info.Settings)
}

// devVersion is "<release>-dev+<commit>" with the 12-digit commit of the
// build settings (vcs.revision; ".dirty" when vcs.modified), or
// "<release>-dev+unknown" without one.
func devVersion(release string, settings []debug.BuildSetting) string {
	commit, dirty := "unknown", ""
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			if len(s.Value) >= 12 {
				commit = s.Value[:12]
			}
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ".dirty"
			}
		}
	}
	if commit == "unknown" {
		dirty = ""
	}
	return release + "-dev+" + commit + dirty
}
