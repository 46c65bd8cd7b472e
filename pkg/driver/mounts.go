package driver

import (
	"errors"
	"io/fs"
	"path/filepath"

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

// mountDevice returns the source of the topmost mount at path and how many
// mounts share that source.
func mountDevice(m mount.Interface, path string) (string, int, error) {
	mps, err := m.List()
	if err != nil {
		return "", 0, err
	}
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		path = resolved
	}
	device := ""
	for _, mp := range mps {
		if mp.Path == path {
			device = mp.Device // later entries are stacked on top
		}
	}
	refs := 0
	for _, mp := range mps {
		if device != "" && mp.Device == device {
			refs++
		}
	}
	return device, refs, nil
}
