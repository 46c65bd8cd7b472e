package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), []byte("#!fake busybox\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(root, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	return root
}

// readTar returns every entry of a tar stream: name → header and body.
func readTar(t *testing.T, data []byte) (map[string]*tar.Header, map[string][]byte, []string) {
	t.Helper()
	hdrs, bodies := map[string]*tar.Header{}, map[string][]byte{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, bodies, order
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], bodies[h.Name] = h, b
		order = append(order, h.Name)
	}
}

func blob(t *testing.T, bodies map[string][]byte, d descriptor) []byte {
	t.Helper()
	b, ok := bodies[blobPath(d)]
	if !ok {
		t.Fatalf("no blob %s in the archive", d.Digest)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s, size %d; descriptor says size %d", d.Digest, got, len(b), d.Size)
	}
	return b
}

func TestWrite_ArchiveIsAnOCILayoutContainerdCanImport(t *testing.T) {
	img := Image{Name: "localhost/pathmend-lab/busybox:1", Rootfs: testRootfs(t), Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "true"}}
	var buf bytes.Buffer
	if err := Write(&buf, img); err != nil {
		t.Fatal(err)
	}
	_, bodies, _ := readTar(t, buf.Bytes())
	if got := string(bodies["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	var idx index
	if err := json.Unmarshal(bodies["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if diff := cmp.Diff(map[string]string{"io.containerd.image.name": img.Name, "org.opencontainers.image.ref.name": img.Name}, md.Annotations); diff != "" {
		t.Errorf("manifest annotations (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&platform{Architecture: "amd64", OS: "linux"}, md.Platform); diff != "" {
		t.Errorf("platform (-want +got):\n%s", diff)
	}
	var man manifest
	if err := json.Unmarshal(blob(t, bodies, md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(t, bodies, man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 {
		t.Fatalf("manifest has %d layers, want 1", len(man.Layers))
	}
	layer := blob(t, bodies, man.Layers[0])
	if diff := cmp.Diff([]string{man.Layers[0].Digest}, cfg.RootFS.DiffIDs); diff != "" {
		t.Errorf("diff IDs of an uncompressed layer are its digests (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(processConfig{Env: cfg.Config.Env, Entrypoint: img.Entrypoint, Cmd: img.Cmd, WorkingDir: "/"}, cfg.Config); diff != "" {
		t.Errorf("process config (-want +got):\n%s", diff)
	}

	hdrs, files, order := readTar(t, layer)
	if diff := cmp.Diff([]string{"bin/", "bin/busybox", "bin/sh"}, order); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	if h := hdrs["bin/sh"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("bin/sh: type %c link %q, want a symlink to busybox", h.Typeflag, h.Linkname)
	}
	if h := hdrs["bin/busybox"]; h.Mode != 0o755 || h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
		t.Errorf("bin/busybox: mode %o owner %d:%d mtime %v, want 755 0:0 epoch", h.Mode, h.Uid, h.Gid, h.ModTime)
	}
	if got := string(files["bin/busybox"]); got != "#!fake busybox\n" {
		t.Errorf("bin/busybox content %q", got)
	}
}

func TestWrite_SameTreeSameBytes(t *testing.T) {
	root := testRootfs(t)
	var a, b bytes.Buffer
	if err := Write(&a, Image{Name: "x:1", Rootfs: root}); err != nil {
		t.Fatal(err)
	}
	// A later mtime must not change the image.
	if err := os.Chtimes(filepath.Join(root, "bin", "busybox"), epoch.AddDate(30, 0, 0), epoch.AddDate(30, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, Image{Name: "x:1", Rootfs: root}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two archives of the same tree differ")
	}
}

func TestWrite_RefusesSpecialFiles(t *testing.T) {
	root := testRootfs(t)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	err := Write(io.Discard, Image{Name: "x:1", Rootfs: root})
	if err == nil || !strings.Contains(err.Error(), "fifo") {
		t.Errorf("Write with a fifo in the tree = %v, want an error naming it", err)
	}
}

func TestRun_RequiresNameRootfsAndOutput(t *testing.T) {
	for _, args := range [][]string{
		{"-rootfs", "x", "-o", "y"},
		{"-name", "x:1", "-o", "y"},
		{"-name", "x:1", "-rootfs", "x"},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
	root := testRootfs(t)
	err := run([]string{"-name", "x:1", "-rootfs", root, "-entrypoint", "/bin/sh", "-o", filepath.Join(t.TempDir(), "x.tar")})
	if err == nil || !strings.Contains(err.Error(), "-entrypoint") {
		t.Errorf("a non-JSON entrypoint = %v, want an error naming -entrypoint", err)
	}
}
