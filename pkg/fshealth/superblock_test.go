package fshealth

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/internal/testneed"
)

// ext4Image makes a 16 MiB ext4 image with mke2fs and sets superblock
// fields with debugfs, as e2fsprogs writes them.
func ext4Image(t *testing.T, sets ...string) string {
	t.Helper()
	testneed.Tools(t, map[string]string{"mkfs.ext4": "e2fsprogs", "debugfs": "e2fsprogs"}, "mkfs.ext4", "debugfs")
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	for _, s := range sets {
		if out, err := exec.Command("debugfs", "-w", "-R", "ssv "+s, img).CombinedOutput(); err != nil {
			t.Fatalf("debugfs ssv %s: %v: %s", s, err, out)
		}
	}
	return img
}

func readImage(t *testing.T, img string) (Superblock, error) {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return ReadSuperblock(f)
}

// The superblock of a filesystem e2fsprogs made reads as it says: a new
// one records nothing; one whose error record debugfs set (the fields
// ext4 writes after an error) records its count, times, functions, the
// error state and the behaviour.
func TestReadSuperblock_AsE2fsprogsWritesIt(t *testing.T) {
	clean, err := readImage(t, ext4Image(t))
	if err != nil {
		t.Fatal(err)
	}
	if clean.RecordsErrors() || clean.NeedsRecovery || clean.Behavior != "continue" {
		t.Errorf("a new filesystem: %+v", clean)
	}
	img := ext4Image(t, "error_count 7", "first_error_time @1796405719", "first_error_func ext4_wait_block_bitmap",
		"last_error_time @1796405739", "last_error_func __ext4_new_inode", "state 3", "errors 2")
	got, err := readImage(t, img)
	if err != nil {
		t.Fatal(err)
	}
	want := Superblock{ErrorState: true, Errors: 7, Behavior: "remount-ro",
		First: ErrorRecord{Time: time.Unix(1796405719, 0).UTC(), Func: "ext4_wait_block_bitmap"},
		Last:  ErrorRecord{Time: time.Unix(1796405739, 0).UTC(), Func: "__ext4_new_inode"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("superblock (-want +got):\n%s", d)
	}
	if !got.RecordsErrors() || got.Summary() != "7 errors since 2026-12-04T17:35:19Z (the last in __ext4_new_inode)" {
		t.Errorf("RecordsErrors %t, Summary %q", got.RecordsErrors(), got.Summary())
	}
	marked, err := readImage(t, ext4Image(t, "state 3"))
	if err != nil || !marked.RecordsErrors() || marked.Summary() != "marked as having errors" {
		t.Errorf("error state only: %+v, %v", marked, err)
	}
}

func TestReadSuperblock_NotExt(t *testing.T) {
	img := filepath.Join(t.TempDir(), "zero")
	if err := os.WriteFile(img, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readImage(t, img); !errors.Is(err, ErrNotExt) {
		t.Errorf("a zeroed device: %v, want ErrNotExt", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, make([]byte, 1500), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readImage(t, short); err == nil {
		t.Error("a device shorter than a superblock read without an error")
	}
}

// FuzzParseSuperblock: any 1024 bytes parse or are refused, never panic,
// and what parses keeps its names printable and bounded.
func FuzzParseSuperblock(f *testing.F) {
	b := make([]byte, superblockSize)
	b[sbMagic], b[sbMagic+1] = 0x53, 0xEF
	f.Add(b)
	f.Add(make([]byte, 10))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := ParseSuperblock(in)
		if err != nil {
			return
		}
		for _, name := range []string{s.First.Func, s.Last.Func} {
			if len(name) > 32 {
				t.Fatalf("function name of %d bytes", len(name))
			}
			for _, c := range name {
				if c < 0x20 || c >= 0x7f {
					t.Fatalf("unprintable %q", name)
				}
			}
		}
	})
}
