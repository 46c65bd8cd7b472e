package deploy

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var versionFile string

// Version is the release the manifests and the chart install (the file
// VERSION, e.g. "v0.1.0"): the image tag they name, and the release a
// development build of pathmend reports as "<Version>-dev+<commit>".
var Version = strings.TrimSpace(versionFile)
