package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// semver parses "vX.Y.Z" or "X.Y.Z".
func semver(t *testing.T, s string) [3]int {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	var v [3]int
	if len(parts) != 3 {
		t.Fatalf("%q is not X.Y.Z", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("%q is not X.Y.Z", s)
		}
		v[i] = n
	}
	return v
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

var (
	changelogSection = regexp.MustCompile(`(?m)^## (.*)$`)
	releasedSection  = regexp.MustCompile(`^\[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`)
)

// releases are the released sections of CHANGELOG.md, newest first.
func releases(t *testing.T) []string {
	t.Helper()
	log := readDoc(t, "../CHANGELOG.md")
	var out []string
	for i, m := range changelogSection.FindAllStringSubmatch(log, -1) {
		if i == 0 {
			if m[1] != "[Unreleased]" {
				t.Errorf("CHANGELOG.md: the first section is %q, want [Unreleased]", m[1])
			}
			continue
		}
		r := releasedSection.FindStringSubmatch(m[1])
		if r == nil {
			t.Errorf("CHANGELOG.md: section %q is not \"[X.Y.Z] - YYYY-MM-DD\"", m[1])
			continue
		}
		out = append(out, r[1])
	}
	return out
}

// TestVersion_ChangelogSections: [Unreleased] first, then one dated
// section per release, newest first, each with its link to the release
// tag; deploy/VERSION is the release being prepared (newer than every
// released section) or, on the release commit, the newest section.
func TestVersion_ChangelogSections(t *testing.T) {
	version := semver(t, readVersion(t))
	log := readDoc(t, "../CHANGELOG.md")
	rels := releases(t)
	for i, r := range rels {
		if i > 0 && !less(semver(t, r), semver(t, rels[i-1])) {
			t.Errorf("CHANGELOG.md: %s follows %s: sections go newest first", r, rels[i-1])
		}
		if !strings.Contains(log, "\n["+r+"]: https://github.com/pathmend/pathmend/releases/tag/v"+r+"\n") {
			t.Errorf("CHANGELOG.md: no link [%s] to the release tag v%s", r, r)
		}
	}
	if !strings.Contains(log, "\n[Unreleased]: https://github.com/pathmend/pathmend/") {
		t.Error("CHANGELOG.md: no link for [Unreleased]")
	}
	if len(rels) > 0 && less(version, semver(t, rels[0])) {
		t.Errorf("deploy/VERSION %s is older than the newest release in CHANGELOG.md, %s", readVersion(t), rels[0])
	}
}

// tagRef finds where a doc names a git tag of pathmend: kustomize's ?ref=,
// a checkout, a release or compare link.
var tagRef = regexp.MustCompile(`(?:\?ref=|git checkout |releases/tag/|compare/|/tree/)(v\d+\.\d+\.\d+)`)

// TestVersion_DocsNameOnlyReleasedTags: no page of the repository tells a
// reader to use a tag that was never released: every tag named is a
// released section of CHANGELOG.md and, in a git checkout, an existing
// tag.
func TestVersion_DocsNameOnlyReleasedTags(t *testing.T) {
	released := map[string]bool{}
	for _, r := range releases(t) {
		released["v"+r] = true
	}
	var tags map[string]bool
	if out, err := exec.Command("git", "-C", "..", "tag", "--list", "v*").Output(); err == nil {
		tags = map[string]bool{}
		for _, tag := range strings.Fields(string(out)) {
			tags[tag] = true
		}
	}
	checked := 0
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && p != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		checked++
		for _, m := range tagRef.FindAllStringSubmatch(string(b), -1) {
			if !released[m[1]] {
				t.Errorf("%s: %q names %s, which CHANGELOG.md does not list as released", p, m[0], m[1])
			}
			if tags != nil && !tags[m[1]] {
				t.Errorf("%s: %q names %s, which is not a tag of this repository", p, m[0], m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Errorf("only %d Markdown files checked; the walk is broken", checked)
	}
}
