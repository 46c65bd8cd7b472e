// Package readertest is test support only: the checks every reader of
// pathmend that remembers sysfs between reads must pass. Changes applies
// random kernel changes to a tree and compares the reader with a fresh
// full read after each; Captures replays the lab's captures through both.
// The packages hold the readers and the change generators; this package
// holds the loops. No production code imports it.
package readertest

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// Read is one read of a tree: a remembering reader's next read or a fresh
// full read.
type Read[T any] func() (T, error)

// Changes compares remembering with fresh, then applies steps changes
// (change applies one to the tree and says what it was) and compares
// again after each. Results must be equal and errors must have the same
// text. check, when set, runs with the fresh result after each
// successful comparison. kinds, when set, counts the changes whose
// description holds each of its keys. The history of changes is part of
// every failure.
func Changes[T any](t *testing.T, steps int, remembering, fresh Read[T], change func() string, check func(history string, fresh T), kinds map[string]int) {
	t.Helper()
	history := []string{"initial"}
	for step := 0; ; step++ {
		want, werr := fresh()
		got, gerr := remembering()
		h := strings.Join(history, "; ")
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("after %s: fresh read error %v, remembering reader error %v", h, werr, gerr)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("after %s: remembering reader differs from a fresh read (-fresh +reader):\n%s", h, d)
		}
		if check != nil && werr == nil {
			check(h, want)
		}
		if step == steps {
			return
		}
		what := change()
		history = append(history, what)
		for k := range kinds {
			if strings.Contains(what, k) {
				kinds[k]++
			}
		}
	}
}

// Exercised fails t for every key of kinds that counted no change.
func Exercised(t *testing.T, kinds map[string]int) {
	t.Helper()
	for k, n := range kinds {
		if n == 0 {
			t.Errorf("no %q change among the random steps: the property was not exercised", k)
		}
	}
}

// Kinds returns a counter for Changes with every key at zero.
func Kinds(keys ...string) map[string]int {
	m := make(map[string]int, len(keys))
	for _, k := range keys {
		m[k] = 0
	}
	return m
}

// Captures replays every capture matching glob, twice over, under one
// root: each replaces the previous one (every object new, names reused)
// and is read by one remembering reader right after and once more
// unchanged; both reads must equal a fresh read of the root.
func Captures[T any](t *testing.T, glob string, now time.Time, remembering func(sysfs.FS) Read[T], fresh func(sysfs.FS) Read[T]) {
	t.Helper()
	names, err := filepath.Glob(glob)
	if err != nil || len(names) == 0 {
		t.Fatalf("no captures match %s (%v)", glob, err)
	}
	root := filepath.Join(t.TempDir(), "sys")
	fsys := sysfs.New(root)
	read, full := remembering(fsys), fresh(fsys)
	for round := range 2 {
		for _, n := range names {
			f, err := sysfstest.LoadFixture(n)
			if err != nil {
				t.Fatal(err)
			}
			if err := sysfstest.Replace(root, f, now); err != nil {
				t.Fatal(err)
			}
			for _, when := range []string{"after the replacement", "unchanged"} {
				want, err := full()
				if err != nil {
					t.Fatalf("round %d, %s %s: fresh read: %v", round, filepath.Base(n), when, err)
				}
				got, err := read()
				if err != nil {
					t.Fatalf("round %d, %s %s: %v", round, filepath.Base(n), when, err)
				}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("round %d, %s %s (-fresh +reader):\n%s", round, filepath.Base(n), when, d)
				}
			}
		}
	}
}
