package sysfstest

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Materialize loads the fixture file at fixturePath and writes it below
// dir as a real tree a sysfs.FS can be rooted at. See
// (*Fixture).Materialize for what each entry becomes.
func Materialize(fixturePath, dir string, now time.Time) error {
	f, err := LoadFixture(fixturePath)
	if err != nil {
		return err
	}
	return f.Materialize(dir, now)
}

// Materialize writes the fixture below dir, which must exist (a test's
// t.TempDir()). Nothing outside dir is touched and nothing existing is
// overwritten.
//
//   - dir entries become directories (0755) whose mtime is now - Age, so
//     a reader that takes a controller directory's mtime as its creation
//     time sees the age the capture saw;
//   - file entries become regular files with the recorded permission bits
//     and content;
//   - wo entries become empty regular files with the recorded mode (0200):
//     pathmend's O_WRONLY open and write succeed and a test reads back what
//     was written (as root, or after a chmod);
//   - err entries become mode-0000 files holding the error name: a
//     non-root reader gets EACCES, root reads the name;
//   - link entries become symlinks with the recorded target, which must
//     resolve inside dir.
//
// Ancestor directories a fixture does not list are created with mtime now.
func (f *Fixture) Materialize(dir string, now time.Time) error {
	if err := f.Validate(); err != nil {
		return err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("materialize: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("materialize: %s is not a directory", dir)
	}
	sorted := &Fixture{Entries: append([]Entry(nil), f.Entries...)}
	sorted.Sort()
	entries := sorted.Entries

	for _, e := range entries {
		if e.Kind == KindLink {
			resolved := path.Join(path.Dir(e.Path), e.Target)
			if resolved == ".." || strings.HasPrefix(resolved, "../") {
				return fmt.Errorf("materialize link %s: target %q leaves the tree", e.Path, e.Target)
			}
		}
		full := filepath.Join(dir, filepath.FromSlash(e.Path))
		if e.Kind != KindDir {
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return fmt.Errorf("materialize %s: %w", e.Path, err)
			}
		}
		if err := materializeEntry(full, e); err != nil {
			return fmt.Errorf("materialize %s %s: %w", e.Kind, e.Path, err)
		}
	}
	// Directory times last: creating a child changes its parent's mtime.
	for _, e := range entries {
		if e.Kind != KindDir {
			continue
		}
		t := now.Add(-e.Age)
		if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(e.Path)), t, t); err != nil {
			return fmt.Errorf("materialize dir %s: %w", e.Path, err)
		}
	}
	return nil
}

func materializeEntry(full string, e Entry) error {
	switch e.Kind {
	case KindDir:
		err := os.MkdirAll(full, 0o755)
		if err != nil {
			return err
		}
		// MkdirAll succeeds on an existing directory but not on a file.
		st, err := os.Lstat(full)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return fmt.Errorf("%s exists and is not a directory", full)
		}
		return nil
	case KindFile:
		return writeNew(full, e.Value, e.Mode.Perm())
	case KindWriteOnly:
		return writeNew(full, "", e.Mode.Perm())
	case KindUnreadable:
		return writeNew(full, e.Value, 0)
	case KindLink:
		return os.Symlink(e.Target, full)
	}
	return fmt.Errorf("unknown entry kind %q", e.Kind)
}

// writeNew creates a file that must not exist, writes content and then
// sets the mode (so a 0444 or 0000 attribute can still be written once).
func writeNew(full, content string, mode fs.FileMode) error {
	fh, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, werr := fh.WriteString(content)
	cerr := fh.Close()
	if werr != nil {
		return werr
	}
	if cerr != nil {
		return cerr
	}
	return os.Chmod(full, mode)
}
