package mounts_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/internal/testneed"
	. "github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
)

func read(t *testing.T) *Table {
	t.Helper()
	infos, err := ReadInfo(SelfMountInfo)
	if err != nil {
		t.Fatal(err)
	}
	return NewTable(infos)
}

func sources(ls []Layer) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Source)
	}
	return out
}

// TestUnmount_OnlyTheLayerAskedFor runs on the real kernel: Unmount
// refuses a layer that is not the top of its path, and the kernel refuses
// one with a mount inside it; the layers stay.
func TestUnmount_OnlyTheLayerAskedFor(t *testing.T) {
	testneed.Root(t, "mounting tmpfs")
	dir := filepath.Join(t.TempDir(), "a b") // a space: mountinfo escapes it
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mountstest.Tmpfs(t, dir, "pm-ours")
	mountstest.Tmpfs(t, dir, "pm-top")
	s := read(t).Stack(dir)
	if got := sources(s); len(got) != 2 || got[0] != "pm-ours" || got[1] != "pm-top" {
		t.Fatalf("stack %v", got)
	}
	ours, top := s[0], s[1]
	if err := Unmount(ours); !errors.Is(err, ErrNotTop) {
		t.Fatalf("Unmount of the layer under another: %v, want ErrNotTop", err)
	}
	if got := sources(read(t).Stack(dir)); len(got) != 2 {
		t.Fatalf("stack after the refusal: %v", got)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mountstest.Tmpfs(t, filepath.Join(dir, "sub"), "pm-inside")
	if err := Unmount(top); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("Unmount of a layer with a mount inside: %v, want EBUSY", err)
	}
	if err := unix.Unmount(filepath.Join(dir, "sub"), 0); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(top); err != nil {
		t.Fatal(err)
	}
	if err := mountstest.TmpfsBeneath(dir, "pm-beneath"); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			testneed.Skip(t, "move_mount MOVE_MOUNT_BENEATH needs Linux 6.5: %v", err)
		}
		t.Fatal(err)
	}
	s = read(t).Stack(dir)
	if got := sources(s); len(got) != 2 || got[0] != "pm-beneath" || got[1] != "pm-ours" {
		t.Fatalf("stack after a mount beneath: %v", got)
	}
	if err := Unmount(s[0]); !errors.Is(err, ErrNotTop) {
		t.Fatalf("Unmount of the layer beneath: %v, want ErrNotTop", err)
	}
	if err := Unmount(s[1]); err != nil {
		t.Fatal(err)
	}
	if got := sources(read(t).Stack(dir)); len(got) != 1 || got[0] != "pm-beneath" {
		t.Fatalf("stack at the end: %v", got)
	}
}

func TestUnmount_RefusesASymlink(t *testing.T) {
	testneed.Root(t, "mounting tmpfs")
	dir := t.TempDir()
	real, link := filepath.Join(dir, "real"), filepath.Join(dir, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	mountstest.Tmpfs(t, real, "pm-real")
	l := read(t).Stack(real)[0]
	l.MountPoint = link
	if err := Unmount(l); !errors.Is(err, ErrNotTop) {
		t.Fatalf("Unmount through a symlink: %v, want ErrNotTop", err)
	}
	if len(read(t).Stack(real)) != 1 {
		t.Fatal("the mount behind the symlink was unmounted")
	}
}

func TestCurrentNamespace(t *testing.T) {
	ns, err := CurrentNamespace()
	if err != nil {
		t.Fatal(err)
	}
	if len(ns.Boot) != 36 || len(ns.Mount) < len("mnt:[1]") {
		t.Fatalf("namespace %+v", ns)
	}
}
