package driver

import (
	"errors"
	"io/fs"

	mount "k8s.io/mount-utils"
)

// isMountPoint reports whether something is mounted at path, reading
// mountinfo when a stat cannot tell (bind mounts of the same filesystem).
// A path that does not exist is not a mount point.
func isMountPoint(m mount.Interface, path string) (bool, error) {
	mnt, err := m.IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return mnt, err
}
