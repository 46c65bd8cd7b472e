package driver

import (
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"

	mount "k8s.io/mount-utils"
)

// isMountPoint reports whether something is mounted at path, reading
// mountinfo when a stat cannot tell (bind mounts of the same filesystem).
// A path that does not exist is not a mount point.
//
// A filesystem that has shut down (XFS) answers EIO to any stat of its
// root, so a mount point of it cannot be stat'ed: then the mount table
// alone tells, with the path's parent resolved (mountinfo lists resolved
// paths) and its last element as given.
func isMountPoint(m mount.Interface, path string) (bool, error) {
	mnt, err := m.IsMountPoint(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, syscall.EIO):
		mps, lerr := m.List()
		if lerr != nil {
			return false, err
		}
		p := filepath.Clean(path)
		if parent, perr := filepath.EvalSymlinks(filepath.Dir(p)); perr == nil {
			p = filepath.Join(parent, filepath.Base(p))
		}
		for _, mp := range mps {
			if mp.Path == p {
				return true, nil
			}
		}
		return false, nil
	}
	return mnt, err
}
