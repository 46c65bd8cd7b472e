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
	// Mount is the mount namespace as this process sees it: the link
	// /proc/self/ns/mnt with the process's ID and start time,
	// "mnt:[4026532281] pid 1234 start 56789" (ProcessNamespace). The
	// link alone does not name one namespace of a boot: the kernel gives
	// a new namespace the lowest free inode number, so the container of
	// an upgraded or restarted plugin pod often gets the number of the
	// one it replaced, while every mount in it has a new ID.
	Mount string
}

// ProcessNamespace is the identity of the mount namespace link seen by
// the process pid started start clock ticks after boot (field 22 of
// /proc/PID/stat, StartTime). A process ID and its start time name one
// process of a boot, and a namespace whose inode number was reused was
// made after every process of the namespace that had it before left
// it, so the identity is unique within the boot. A pathmend restarted
// in the same namespace (a host process) gets another identity too: the
// layers it recorded before are then matched as those of another
// namespace, by every field a mount keeps across namespaces.
func ProcessNamespace(link string, pid int, start uint64) string {
	return fmt.Sprintf("%s pid %d start %d", link, pid, start)
}

// StartTime is the start time of a process, in clock ticks after boot,
// from its /proc/PID/stat: the 22nd field, counted after the command
// name, which is in parentheses and may itself hold spaces and
// parentheses.
func StartTime(stat []byte) (uint64, error) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", short(s))
	}
	// After the name: state (field 3) … starttime (field 22).
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("stat %q: %d fields after the command name, want at least 20", short(s), len(f))
	}
	n, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat %q: start time: %w", short(s), err)
	}
	return n, nil
}

// short bounds a quoted /proc value in an error.
func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
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
		stat, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			currentErr = fmt.Errorf("read the process's start time: %w", err)
			return
		}
		start, err := StartTime(stat)
		if err != nil {
			currentErr = fmt.Errorf("read the process's start time: %w", err)
			return
		}
		current = Namespace{Boot: strings.TrimSpace(string(b)), Mount: ProcessNamespace(ns, os.Getpid(), start)}
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
