package sysfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFS_ReadsTrimsAndBounds(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, v string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("class/nvme/nvme0/state", "live\n", 0o444)
	write("class/nvme/nvme0/model", "pathmend-lab"+strings.Repeat(" ", 28)+"\n", 0o444)
	write("class/nvme/nvme0/cntlid", "7\n", 0o444)
	write("class/nvme/nvme0/huge", strings.Repeat("x", 5000), 0o444)
	write("class/nvme/nvme0/delete_controller", "", 0o200)
	f := New(dir)

	if v, err := f.ReadAttr("class/nvme/nvme0/state"); err != nil || v != "live" {
		t.Errorf("state = %q, %v", v, err)
	}
	if v, _ := f.ReadAttr("class/nvme/nvme0/model"); v != "pathmend-lab" {
		t.Errorf("model = %q, want the padding trimmed", v)
	}
	if n, err := f.ReadIntAttr("class/nvme/nvme0/cntlid"); err != nil || n != 7 {
		t.Errorf("cntlid = %d, %v", n, err)
	}
	_, err := f.ReadAttr("class/nvme/nvme0/absent")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "class/nvme/nvme0/absent") {
		t.Errorf("missing required attribute: %v, want ErrNotExist naming the path", err)
	}
	if _, ok, err := f.ReadOptionalAttr("class/nvme/nvme0/absent"); ok || err != nil {
		t.Errorf("missing optional attribute: ok=%t err=%v", ok, err)
	}
	if _, err := f.ReadAttr("class/nvme/nvme0/huge"); err == nil {
		t.Error("an attribute over one page was read")
	}
	if err := f.WriteAttr("class/nvme/nvme0/delete_controller", "1"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "class/nvme/nvme0/delete_controller")); string(b) != "1" {
		t.Errorf("written %q", b)
	}
	if err := f.WriteAttr("class/nvme/nvme0/rescan_controller", "1"); err == nil {
		t.Error("WriteAttr created a file")
	}
	if got := f.Path("../../etc/passwd"); got != filepath.Join(dir, "etc/passwd") {
		t.Errorf("Path escaped the root: %s", got)
	}
}
