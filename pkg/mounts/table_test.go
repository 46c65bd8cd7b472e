package mounts_test

import (
	"testing"

	. "github.com/pathmend/pathmend/pkg/mounts"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/volume"
)

// A container's table: the root's parent is outside it; a staging mount,
// a bind of it at a target, a tmpfs stacked on the bind, a tmpfs over an
// ancestor that hides a second bind, and a mount inside the staging
// filesystem.
const sample = `1002 900 0:50 / / rw - overlay overlay rw
1003 1002 253:1 /var/lib/kubelet /var/lib/kubelet rw shared:1 - ext4 /dev/vda1 rw
1010 1003 259:3 / /var/lib/kubelet/plugins/st rw - ext4 /dev/nvme0n1 rw
1011 1003 259:3 / /var/lib/kubelet/pods/p1/mount rw - ext4 /dev/nvme0n1 rw
1012 1011 0:60 / /var/lib/kubelet/pods/p1/mount rw - tmpfs foreign rw
1013 1003 259:3 / /var/lib/kubelet/pods/p2/mount rw - ext4 /dev/nvme0n1 rw
1014 1003 0:61 / /var/lib/kubelet/pods rw - tmpfs cover rw
1015 1010 0:62 / /var/lib/kubelet/plugins/st/sub rw - tmpfs inside rw
1016 1003 0:63 / /var/lib/kubelet/with\040space rw - tmpfs a\134b rw
`

func sampleTable(t *testing.T) *Table {
	t.Helper()
	infos, err := ParseInfo([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	return NewTable(infos)
}

func ids(ls []Layer) []int {
	out := []int{}
	for _, l := range ls {
		out = append(out, l.ID)
	}
	return out
}

func TestTable_StacksAndResolution(t *testing.T) {
	tb := sampleTable(t)
	for _, c := range []struct {
		path    string
		stack   []int
		resolve int
	}{
		{"/", []int{1002}, 1002},
		{"/var/lib/kubelet", []int{1003}, 1003},
		{"/var/lib/kubelet/plugins/st", []int{1010}, 1010},
		{"/var/lib/kubelet/plugins/st/sub", []int{1015}, 1015},
		{"/var/lib/kubelet/plugins/st/other", []int{}, 1010},
		// p1 and p2 are under the tmpfs that covers pods/: hidden.
		{"/var/lib/kubelet/pods/p1/mount", []int{}, 1014},
		{"/var/lib/kubelet/pods", []int{1014}, 1014},
		{"/var/lib/kubelet/with space", []int{1016}, 1016},
		{"/var/lib/kubelet/nothing", []int{}, 1003},
	} {
		if d := cmp.Diff(c.stack, ids(tb.Stack(c.path))); d != "" {
			t.Errorf("Stack(%s) (-want +got):\n%s", c.path, d)
		}
		if l, _ := tb.Resolve(c.path); l.ID != c.resolve {
			t.Errorf("Resolve(%s) = %d, want %d", c.path, l.ID, c.resolve)
		}
	}
	if d := cmp.Diff([]int{1011, 1012}, ids(tb.At("/var/lib/kubelet/pods/p1/mount"))); d != "" {
		t.Errorf("At (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]int{1015}, ids(tb.Below("/var/lib/kubelet/plugins/st"))); d != "" {
		t.Errorf("Below (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]int{1015}, ids(tb.Children(1010))); d != "" {
		t.Errorf("Children (-want +got):\n%s", d)
	}
	for id, want := range map[int]bool{1010: true, 1011: false, 1012: false, 1013: false, 1014: true, 1015: true} {
		if got := tb.Visible(id); got != want {
			t.Errorf("Visible(%d) = %t, want %t", id, got, want)
		}
	}
	if c, ok := tb.Covering(1013); !ok || c.ID != 1014 {
		t.Errorf("Covering(1013) = %v %t, want the tmpfs 1014", c, ok)
	}
	l, _ := tb.Layer(1016)
	if l.Source != `a\b` || l.MountPoint != "/var/lib/kubelet/with space" {
		t.Errorf("escapes not undone: %+v", l)
	}
}

func TestTable_StackAfterMountBeneath(t *testing.T) {
	// 31 was slid under 30 (MOVE_MOUNT_BENEATH): 30's parent is 31.
	infos, err := ParseInfo([]byte(`1 0 8:1 / / rw - ext4 /dev/sda1 rw
30 31 259:3 / /k/st rw - ext4 /dev/nvme0n1 rw
31 1 0:70 / /k/st rw - tmpfs beneath rw
`))
	if err != nil {
		t.Fatal(err)
	}
	tb := NewTable(infos)
	if d := cmp.Diff([]int{31, 30}, ids(tb.Stack("/k/st"))); d != "" {
		t.Errorf("Stack (-want +got):\n%s", d)
	}
}

func TestParseInfo_RefusesBrokenLines(t *testing.T) {
	for _, line := range []string{
		"1 0 8:1 / / rw",
		"x 0 8:1 / / rw - ext4 /dev/sda1 rw",
		"1 0 81 / / rw - ext4 /dev/sda1 rw",
		"1 0 8:1 / / rw shared:1 ext4 /dev/sda1 rw x",
	} {
		if _, err := ParseInfo([]byte(line + "\n")); err == nil {
			t.Errorf("%q parsed", line)
		}
	}
}

func FuzzParseInfo(f *testing.F) {
	f.Add([]byte(sample))
	f.Fuzz(func(t *testing.T, b []byte) {
		infos, err := ParseInfo(b)
		if err != nil {
			return
		}
		tb := NewTable(infos)
		for _, l := range tb.Layers() {
			tb.Stack(l.MountPoint)
			tb.Visible(l.ID)
			tb.Covering(l.ID)
		}
	})
}

// A bind of a device node the kernel removed since shows its root with
// "//deleted" after it: it is still the layer pathmend recorded (a block
// volume's publication whose namespace was re-created must unpublish).
func TestLayer_IsTheSameWhenItsSourceWasUnlinked(t *testing.T) {
	ns := Namespace{Boot: "b", Mount: "mnt:[1]"}
	rec := volume.MountLayer{ID: 34, Parent: 22, Dev: volume.DeviceNumber{Major: 0, Minor: 5}, Root: "/nvme0n2", FSType: "devtmpfs", Source: "devtmpfs", Boot: "b", Namespace: "mnt:[1]"}
	l := Layer{ID: 34, Parent: 22, Dev: rec.Dev, Root: "/nvme0n2//deleted", FSType: "devtmpfs", Source: "devtmpfs"}
	if !l.Is(rec, ns) {
		t.Errorf("the bind of a removed node is not the recorded layer")
	}
	l.Root = "/nvme0n3"
	if l.Is(rec, ns) {
		t.Errorf("a bind of another node is the recorded layer")
	}
	if SameRoot("/nvme0n2/deleted", "/nvme0n2") || !SameRoot("/x", "/x") {
		t.Errorf("SameRoot")
	}
}
