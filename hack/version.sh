#!/usr/bin/env bash
# Print the version a build of this checkout carries (make build, make
# image, the lab):
#
#   vX.Y.Z                     HEAD is the release tag deploy/VERSION names
#   vX.Y.Z-dev+<commit>        any other commit: the release it leads to
#   vX.Y.Z-dev+<commit>.dirty  … with uncommitted changes
#
# deploy/VERSION is the release the manifests and the chart install; it is
# raised right after a release is tagged, so a development build names the
# release it will become. Outside a git checkout (a source tarball) the
# commit is "unknown".
set -euo pipefail
cd "$(dirname "$0")/.."
release=$(tr -d '[:space:]' <deploy/VERSION)
if ! commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
	echo "$release-dev+unknown"
	exit 0
fi
dirty=
git diff --quiet HEAD -- 2>/dev/null || dirty=.dirty
if [ -z "$dirty" ] && git tag --points-at HEAD 2>/dev/null | grep -qx "$release"; then
	echo "$release"
	exit 0
fi
echo "$release-dev+$commit$dirty"
