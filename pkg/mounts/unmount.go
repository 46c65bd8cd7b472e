package mounts

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Namespace is the scope a mount ID is valid in: the mount namespace the
// table was read in, during one boot of the kernel.
type Namespace struct {
	// Boot is /proc/sys/kernel/random/boot_id: new at every boot.
	Boot string
	// Mount is the link /proc/self/ns/mnt, "mnt:[4026532281]".
	Mount string
}

var (
	currentOnce sync.Once
	current     Namespace
	currentErr  error
)

// CurrentNamespace returns this process's mount namespace and the boot
// ID, read once: neither changes while the process runs.
func CurrentNamespace() (Namespace, error) {
	currentOnce.Do(func() {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			currentErr = fmt.Errorf("read boot ID: %w", err)
			return
		}
		ns, err := os.Readlink("/proc/self/ns/mnt")
		if err != nil {
			currentErr = fmt.Errorf("read mount namespace: %w", err)
			return
		}
		current = Namespace{Boot: strings.TrimSpace(string(b)), Mount: ns}
	})
	return current, currentErr
}

// ErrNotTop is wrapped by Unmount when the mount on top of the path is
// not the layer it was asked to unmount: something was mounted there, or
// the layer went, since the table was read.
var ErrNotTop = errors.New("the mount on top of the path is not the layer to unmount")

// Unmount unmounts the layer l at its mount point, and nothing else. It
// opens the mount point itself (O_PATH, a symlink there not followed),
// asks statx(2) which mount the path is on and whether it is that
// mount's root, closes it — an open descriptor would make the mount busy
// — and unmounts the path without following a symlink. When the top of
// the path is not l it returns an error wrapping ErrNotTop and unmounts
// nothing. A mount stacked on l, or mounted inside it, makes the kernel
// refuse with EBUSY.
//
// The check and the umount(2) are two system calls: a mount made at the
// same path between them, within microseconds, would be the one
// unmounted. Linux has no umount by mount ID; the caller reads the table
// again afterwards and reports a layer it did not mean to remove.
func Unmount(l Layer) error {
	path := l.MountPoint
	id, root, err := mountOf(path)
	if err != nil {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if id != uint64(l.ID) || !root {
		return fmt.Errorf("unmount %s: %w (the path is on mount %d, expected %d)", path, ErrNotTop, id, l.ID)
	}
	if err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// mountOf returns the ID of the mount path is on and whether path is that
// mount's root, without following a symlink at path.
func mountOf(path string) (id uint64, root bool, err error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false, err
	}
	defer unix.Close(fd)
	var st unix.Statx_t
	err = unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &st)
	if err == nil && st.Mask&unix.STATX_MNT_ID != 0 {
		root = true
		if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
			root = st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
		}
		return st.Mnt_id, root, nil
	}
	// Before Linux 5.8: the descriptor's mnt_id in fdinfo (3.15 and
	// later); the caller checked the path is the layer's mount point.
	b, ferr := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if ferr != nil {
		return 0, false, fmt.Errorf("statx: %v; fdinfo: %w", err, ferr)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			n, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, true, perr
		}
	}
	return 0, false, fmt.Errorf("statx: %v; fdinfo has no mnt_id", err)
}
