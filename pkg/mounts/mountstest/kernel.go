package mountstest

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a small tmpfs named source at dir, on top of whatever is
// there, on the real kernel (root only), and unmounts what is left at
// dir when the test ends.
func Tmpfs(t testing.TB, dir, source string) {
	t.Helper()
	if err := unix.Mount(source, dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { UnmountAll(dir) })
}

// UnmountAll detaches every mount at dir (umount -l until none is left):
// test cleanup only.
func UnmountAll(dir string) {
	for range 64 {
		if unix.Unmount(dir, unix.MNT_DETACH) != nil {
			return
		}
	}
}

// TmpfsBeneath slides a tmpfs named source under the stack at dir on the
// real kernel (move_mount(2) MOVE_MOUNT_BENEATH, Linux 6.5; EINVAL on
// older kernels and when nothing is mounted at dir).
func TmpfsBeneath(dir, source string) error {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", source); err != nil {
		return err
	}
	if err := unix.FsconfigSetString(fsfd, "size", "1m"); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return err
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	const moveMountBeneath = 0x200 // MOVE_MOUNT_BENEATH
	return unix.MoveMount(mfd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath)
}
