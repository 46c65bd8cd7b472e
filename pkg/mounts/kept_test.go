package mounts_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/internal/testneed"
	. "github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
)

// TestKept_ReadsAgainOnlyAfterTheKernelSaysAMountChanged runs on the real
// kernel: the kept table of /proc/self/mountinfo is the same table until
// a mount, a bind, a move, a remount or an unmount, and after each one
// holds it at the next call; the file was read once per call after a
// change. (An *os.File of the same file, joined to Go's netpoller, saw
// its change signals taken by the runtime's epoll_wait: Kept keeps a
// raw descriptor.)
func TestKept_ReadsAgainOnlyAfterTheKernelSaysAMountChanged(t *testing.T) {
	testneed.Root(t, "mounting tmpfs")
	k := NewKept(SelfMountInfo)
	t.Cleanup(func() { k.Close() })
	first := table(t, k)
	for range 3 {
		if again := table(t, k); again != first {
			t.Fatal("the table was read again with no mount changed")
		}
	}
	if n := k.Reads(); n != 1 {
		t.Fatalf("%d reads with no change, want 1", n)
	}
	dir := t.TempDir()
	mountstest.Tmpfs(t, dir, "pm-kept")
	mounted := table(t, k)
	if got := sources(mounted.Stack(dir)); len(got) != 1 || got[0] != "pm-kept" {
		t.Fatalf("stack after the mount: %v", got)
	}
	if table(t, k) != mounted {
		t.Fatal("the table was read again after one change was read")
	}
	// A bind and a move are changes of the layers too.
	bind := filepath.Join(t.TempDir(), "bind")
	if err := os.Mkdir(bind, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if got := sources(table(t, k).Stack(bind)); len(got) != 1 || got[0] != "pm-kept" {
		t.Fatalf("stack at the bind: %v", got)
	}
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Mkdir(moved, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(bind, moved, "", unix.MS_MOVE, ""); err != nil {
		unix.Unmount(bind, 0)
		t.Fatal(err)
	}
	tb := table(t, k)
	if got := sources(tb.Stack(moved)); len(got) != 1 || len(tb.Stack(bind)) != 0 {
		t.Fatalf("after the move: %v at the new place, %v at the old", got, sources(tb.Stack(bind)))
	}
	if err := unix.Unmount(moved, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	if opts := optionsAt(table(t, k), dir); !slices.Contains(opts, "ro") {
		t.Fatalf("options at %s after a remount read-only: %v", dir, opts)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if got := table(t, k).Stack(dir); len(got) != 0 {
		fresh, _ := ReadInfo(SelfMountInfo)
		t.Fatalf("stack after the unmount: %v; a fresh read: %v", sources(got), sources(NewTable(fresh).Stack(dir)))
	}
	if n := k.Reads(); n != 6 {
		t.Fatalf("%d reads, want 6: the first and one after each of the five calls that followed a change", n)
	}
}

// TestKept_ReadsAFileNotOnProcfsEveryTime: a copy of a table signals no
// change, so it is read at every call and an edit is seen.
func TestKept_ReadsAFileNotOnProcfsEveryTime(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	line := "36 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
	if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	k := NewKept(p)
	t.Cleanup(func() { k.Close() })
	if got := len(table(t, k).Layers()); got != 1 {
		t.Fatalf("%d layers, want 1", got)
	}
	line += "40 36 0:50 / /mnt rw - tmpfs pm-copy rw\n"
	if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := sources(table(t, k).Stack("/mnt")); len(got) != 1 || got[0] != "pm-copy" {
		t.Fatalf("stack at /mnt after the edit: %v", got)
	}
	if n := k.Reads(); n != 2 {
		t.Fatalf("%d reads, want 2", n)
	}
}

// TestKept_AnUnreadableFileIsAnErrorAndIsOpenedAgain: an error is
// returned, and the next call opens the file anew.
func TestKept_AnUnreadableFileIsAnErrorAndIsOpenedAgain(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	k := NewKept(p)
	if _, err := k.Table(); err == nil {
		t.Fatal("no error for a missing file")
	}
	if err := os.WriteFile(p, []byte("36 1 8:1 / / rw - ext4 /dev/sda1 rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := len(table(t, k).Layers()); got != 1 {
		t.Fatalf("%d layers, want 1", got)
	}
}

func table(t *testing.T, k *Kept) *Table {
	t.Helper()
	tb, err := k.Table()
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func optionsAt(tb *Table, mp string) []string {
	for _, mi := range tb.Infos() {
		if mi.MountPoint == mp {
			return mi.MountOptions
		}
	}
	return nil
}

// BenchmarkKept compares a call of the kept table when nothing changed
// (one poll) with a read and parse of this process's mount table and a
// table built from it, as every call did before. Run it on a node with
// many mounts to see the difference grow with them.
func BenchmarkKept(b *testing.B) {
	b.Run("unchanged", func(b *testing.B) {
		k := NewKept(SelfMountInfo)
		defer k.Close()
		if _, err := k.Table(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.Table(); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What a call cost before on a node of 1,000 filesystem volumes: a
	// staging mount and a publication each, 2,000 lines, parsed and built.
	b.Run("parse-2000-mounts", func(b *testing.B) {
		var text []byte
		text = append(text, "1 0 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"...)
		for i := range 1000 {
			text = fmt.Appendf(text, "%d 1 259:%d / /var/lib/kubelet/plugins/kubernetes.io/csi/csi.pathmend.io/%064x/globalmount rw,relatime shared:%d - ext4 /dev/nvme%dn1 rw\n", 100+2*i, i, i, 10+i, i)
			text = fmt.Appendf(text, "%d 1 259:%d / /var/lib/kubelet/pods/%032x/volumes/kubernetes.io~csi/pvc-%032x/mount rw,relatime shared:%d - ext4 /dev/nvme%dn1 rw\n", 101+2*i, i, i, i, 10+i, i)
		}
		b.ReportAllocs()
		for b.Loop() {
			infos, err := ParseInfo(text)
			if err != nil || len(infos) != 2001 {
				b.Fatalf("%d lines, %v", len(infos), err)
			}
			NewTable(infos)
		}
	})
	b.Run("read-every-call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			infos, err := ReadInfo(SelfMountInfo)
			if err != nil {
				b.Fatal(err)
			}
			NewTable(infos)
		}
	})
}
