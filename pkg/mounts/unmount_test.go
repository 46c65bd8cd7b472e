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
	"github.com/pathmend/pathmend/pkg/volume"
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
	link, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	start, err := StartTime(stat)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns.Boot) != 36 || ns.Mount != ProcessNamespace(link, os.Getpid(), start) {
		t.Fatalf("namespace %+v, want boot ID and %q", ns, ProcessNamespace(link, os.Getpid(), start))
	}
}

// TestProcessNamespace_AReusedNumberIsAnotherNamespace: the kernel gives
// a new mount namespace the lowest free inode number, so the plugin
// container that replaces another often reads the same link; the
// process in it is another, and so is the identity, and a layer
// recorded by the old process is not taken for one of the new
// namespace by its ID.
func TestProcessNamespace_AReusedNumberIsAnotherNamespace(t *testing.T) {
	old := Namespace{Boot: "b", Mount: ProcessNamespace("mnt:[4026532281]", 4711, 90210)}
	upgraded := Namespace{Boot: "b", Mount: ProcessNamespace("mnt:[4026532281]", 5012, 120033)}
	if old.Mount == upgraded.Mount {
		t.Fatalf("two processes of one boot, one namespace identity %q", old.Mount)
	}
	l := Layer{ID: 140, Parent: 97, Dev: volume.DeviceNumber{Major: 259, Minor: 1}, Root: "/", FSType: "ext4", Source: "/dev/nvme0n1"}
	if !l.Is(l.Record(old), old) {
		t.Error("a layer is not the one it recorded in its own namespace")
	}
	// The new namespace's mount 140 is another mount that happens to
	// have the old one's ID.
	if l.Is(l.Record(old), upgraded) {
		t.Error("a mount ID recorded by the replaced process is taken for the new namespace's")
	}
}

func TestStartTime(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want uint64
		err  bool
	}{
		{stat: "1234 (pathmend) S 1 1234 1234 0 -1 4194560 1510 0 0 0 12 5 0 0 20 0 9 0 56789 1271066624 4521 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n", want: 56789},
		// The command name is the process's to choose: spaces and
		// parentheses in it do not shift the fields.
		{stat: "77 (a) b (c) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n", want: 4242},
		{stat: "77 (a) R 1 77", err: true},
		{stat: "no name at all", err: true},
		{stat: "77 (a) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0", err: true},
	} {
		got, err := StartTime([]byte(tc.stat))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("StartTime(%q) = %d, %v; want %d, error %v", tc.stat, got, err, tc.want, tc.err)
		}
	}
}
