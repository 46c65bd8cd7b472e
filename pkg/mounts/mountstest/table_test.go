package mountstest_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
)

func sources(ls []mounts.Layer) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Source)
	}
	return out
}

// TestTable_StacksAsTheKernelDoes runs one sequence — a mount, a bind of
// it elsewhere, a mount on top, one slid under, one inside — on the
// in-memory table and on the real kernel (as root), and compares the
// stacks and what each bind shows.
func TestTable_StacksAsTheKernelDoes(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake := mountstest.New()
	fake.Foreign(a, "tmpfs", "pm-one", false)
	if err := fake.Mount(a, b, "", []string{"bind"}); err != nil {
		t.Fatal(err)
	}
	fake.Foreign(a, "tmpfs", "pm-top", false)
	fake.Foreign(a, "tmpfs", "pm-under", true)
	ft := fake.Snapshot()
	// Slid under the top, not under the whole stack.
	if got := sources(ft.Stack(a)); !slices.Equal(got, []string{"pm-one", "pm-under", "pm-top"}) {
		t.Errorf("table: stack at a = %v", got)
	}
	if got := sources(ft.Stack(b)); !slices.Equal(got, []string{"pm-one"}) || ft.Stack(b)[0].Root != "/" {
		t.Errorf("table: stack at b = %v", ft.Stack(b))
	}
	// An unmount is of the top; a layer under another is refused.
	if err := fake.UnmountLayer(ft.Stack(a)[1]); err == nil {
		t.Error("table: unmounted a layer under another")
	}

	testneed.Root(t, "mounting tmpfs")
	mountstest.Tmpfs(t, a, "pm-one")
	if err := os.Mkdir(filepath.Join(a, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := bind(filepath.Join(a, "sub"), b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mountstest.UnmountAll(b) })
	mountstest.Tmpfs(t, a, "pm-top")
	if err := mountstest.TmpfsBeneath(a, "pm-under"); err != nil {
		testneed.Skip(t, "move_mount MOVE_MOUNT_BENEATH (Linux 6.5): %v", err)
	}
	infos, err := mounts.ReadInfo(mounts.SelfMountInfo)
	if err != nil {
		t.Fatal(err)
	}
	rt := mounts.NewTable(infos)
	if got := sources(rt.Stack(a)); !slices.Equal(got, []string{"pm-one", "pm-under", "pm-top"}) {
		t.Errorf("kernel: stack at a = %v", got)
	}
	// A bind of a directory in a mount shows its path in that filesystem.
	if s := rt.Stack(b); len(s) != 1 || s[0].Source != "pm-one" || s[0].Root != "/sub" {
		t.Errorf("kernel: stack at b = %+v", s)
	}
	fake2 := mountstest.New()
	fake2.Foreign(a, "tmpfs", "pm-one", false)
	if err := fake2.Mount(filepath.Join(a, "sub"), b, "", []string{"bind"}); err != nil {
		t.Fatal(err)
	}
	if s := fake2.Snapshot().Stack(b); len(s) != 1 || s[0].Root != "/sub" {
		t.Errorf("table: a bind of a directory shows %+v, want root /sub as the kernel", s)
	}
}
