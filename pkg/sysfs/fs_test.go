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

func TestCheckRoot(t *testing.T) {
	dir := t.TempDir()
	mk := func(rel ...string) string {
		root := filepath.Join(append([]string{dir}, rel...)...)
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		return root
	}
	bare := mk("bare") // a container's empty /sys mount point
	mk("onlyclass", "class")
	// A node with no NVMe or iSCSI module loaded: class/ and devices/ only.
	mk("node", "class")
	mk("node", "devices")
	node := filepath.Join(dir, "node")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		root      string
		wantErr   string
		notSysfs  bool
		notExists bool
	}{
		{root: node},
		{root: filepath.Join(dir, "nonexistent"), wantErr: filepath.Join(dir, "nonexistent"), notExists: true},
		{root: bare, wantErr: bare + " has no class/ directory", notSysfs: true},
		{root: filepath.Join(dir, "onlyclass"), wantErr: "has no devices/ directory", notSysfs: true},
		{root: file, wantErr: file + " is not a directory", notSysfs: true},
	} {
		err := New(tc.root).CheckRoot()
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("CheckRoot(%s) = %v, want nil", tc.root, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("CheckRoot(%s) = %v, want it to contain %q", tc.root, err, tc.wantErr)
		}
		if errors.Is(err, ErrNotSysfs) != tc.notSysfs || IsNotExist(err) != tc.notExists {
			t.Errorf("CheckRoot(%s) = %v: ErrNotSysfs %t, not-exist %t", tc.root, err, errors.Is(err, ErrNotSysfs), IsNotExist(err))
		}
	}
}
