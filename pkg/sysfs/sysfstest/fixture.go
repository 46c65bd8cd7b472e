package sysfstest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// FixtureMagic is the first line of every fixture file. The number is the
// format version; a parser refuses versions it does not know.
const FixtureMagic = "# pathmend sysfs fixture v1"

// maxFixtureLine bounds one line of a fixture: an attribute value is at
// most one page, which quoting can at most quadruple.
const maxFixtureLine = 64 << 10

// EntryKind says what a fixture entry is.
type EntryKind string

// Entry kinds, as they appear at the start of a fixture line.
const (
	// KindDir is a directory; Age is capture time minus its mtime.
	KindDir EntryKind = "dir"
	// KindFile is a readable attribute; Value is its content as read.
	KindFile EntryKind = "file"
	// KindWriteOnly is an attribute without read permission
	// (delete_controller, reset_controller, …); it has no value.
	KindWriteOnly EntryKind = "wo"
	// KindUnreadable is an attribute whose read failed on the live system
	// (for example address of a down iSCSI connection: ENOTCONN); Value
	// holds the error name.
	KindUnreadable EntryKind = "err"
	// KindLink is a symlink; Target is the link text as stored.
	KindLink EntryKind = "link"
)

// Entry is one node of a captured sysfs tree.
type Entry struct {
	Kind EntryKind
	// Path is relative to the sysfs root, slash-separated and clean
	// ("class/nvme/nvme0").
	Path string
	// Mode holds the permission bits of file, wo and err entries.
	Mode fs.FileMode
	// Value is the attribute content (file) or the error name (err).
	Value string
	// Target is the link text of a link entry.
	Target string
	// Age is how long before the capture the directory was last modified
	// (dir entries only; never negative).
	Age time.Duration
}

// Fixture is a captured sysfs tree: header comments and entries. A
// Fixture is a plain value; Parse and Encode round-trip it exactly.
type Fixture struct {
	// Comments are the header lines after the magic line, without the
	// leading "# " (scenario, kernel, what to expect).
	Comments []string
	// Entries are sorted by Path by Sort; Parse keeps file order.
	Entries []Entry
}

// Sort orders the entries by path so that parents come before children.
func (f *Fixture) Sort() {
	sort.SliceStable(f.Entries, func(i, j int) bool { return pathLess(f.Entries[i].Path, f.Entries[j].Path) })
}

// pathLess orders paths component by component, so "a/b" < "a/b/c" < "a/b-c".
// It allocates nothing: sorting a tree's fixture calls it n log n times.
func pathLess(a, b string) bool {
	for {
		ai, bi := strings.IndexByte(a, '/'), strings.IndexByte(b, '/')
		ac, bc := a, b
		if ai >= 0 {
			ac = a[:ai]
		}
		if bi >= 0 {
			bc = b[:bi]
		}
		if ac != bc {
			return ac < bc
		}
		if ai < 0 || bi < 0 { // a shorter path is less; equal ones are not
			return ai < 0 && bi >= 0
		}
		a, b = a[ai+1:], b[bi+1:]
	}
}

// Lookup returns the entry at p, if any.
func (f *Fixture) Lookup(p string) (Entry, bool) {
	for _, e := range f.Entries {
		if e.Path == p {
			return e, true
		}
	}
	return Entry{}, false
}

// Encode writes the fixture in its text form:
//
//	# pathmend sysfs fixture v1
//	# <comment>
//	dir  <path> <age>
//	file <path> <mode> <quoted value>
//	wo   <path> <mode>
//	err  <path> <mode> <error name>
//	link <path> <target>
//
// Paths and targets are written bare when they hold no space, quote,
// backslash or control character, Go-quoted otherwise. Values are always
// Go-quoted, so binary attributes survive as \x escapes. Ages are Go
// durations (a capture rounds them to the millisecond).
func (f *Fixture) Encode(w io.Writer) error {
	for _, c := range f.Comments {
		if strings.ContainsAny(c, "\n\r") {
			return fmt.Errorf("encode: comment %q spans lines", c)
		}
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, FixtureMagic)
	for _, c := range f.Comments {
		if c == "" {
			fmt.Fprintln(bw, "#")
			continue
		}
		fmt.Fprintf(bw, "# %s\n", c)
	}
	for _, e := range f.Entries {
		switch e.Kind {
		case KindDir:
			fmt.Fprintf(bw, "dir %s %s\n", quoteToken(e.Path), e.Age)
		case KindFile:
			fmt.Fprintf(bw, "file %s %04o %s\n", quoteToken(e.Path), e.Mode.Perm(), strconv.Quote(e.Value))
		case KindWriteOnly:
			fmt.Fprintf(bw, "wo %s %04o\n", quoteToken(e.Path), e.Mode.Perm())
		case KindUnreadable:
			fmt.Fprintf(bw, "err %s %04o %s\n", quoteToken(e.Path), e.Mode.Perm(), quoteToken(e.Value))
		case KindLink:
			fmt.Fprintf(bw, "link %s %s\n", quoteToken(e.Path), quoteToken(e.Target))
		default:
			return fmt.Errorf("encode %s: unknown entry kind %q", e.Path, e.Kind)
		}
	}
	return bw.Flush()
}

// Bytes returns the encoded fixture.
func (f *Fixture) Bytes() ([]byte, error) {
	var b bytes.Buffer
	if err := f.Encode(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// quoteToken writes a path, target or error name bare when that is
// unambiguous and Go-quoted otherwise.
func quoteToken(s string) string {
	if s == "" || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r <= ' ' || r == '\\' || r == '"' || r == 0x7f || r > 0x7e {
			return strconv.Quote(s)
		}
	}
	return s
}

// ParseFixture reads a fixture in the form Encode writes. It checks every
// path (relative, clean, no "..", no duplicates, no entry below a file or
// link) so that Materialize can trust it.
func ParseFixture(r io.Reader) (*Fixture, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxFixtureLine)
	f := &Fixture{}
	lineNo := 0
	sawMagic := false
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if !sawMagic {
			if line != FixtureMagic {
				return nil, fmt.Errorf("line 1: not a pathmend sysfs fixture (want %q)", FixtureMagic)
			}
			sawMagic = true
			continue
		}
		if line == "" {
			continue
		}
		if line == "#" {
			f.Comments = append(f.Comments, "")
			continue
		}
		if c, ok := strings.CutPrefix(line, "# "); ok {
			f.Comments = append(f.Comments, c)
			continue
		}
		e, err := parseEntry(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		f.Entries = append(f.Entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", lineNo+1, err)
	}
	if !sawMagic {
		return nil, errors.New("empty input: not a pathmend sysfs fixture")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
}

// LoadFixture parses the fixture file at name.
func LoadFixture(name string) (*Fixture, error) {
	fh, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	f, err := ParseFixture(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

func parseEntry(line string) (Entry, error) {
	toks, quoted, err := splitTokens(line)
	if err != nil {
		return Entry{}, err
	}
	if len(toks) < 2 {
		return Entry{}, fmt.Errorf("want an entry kind and a path, got %q", line)
	}
	e := Entry{Kind: EntryKind(toks[0]), Path: toks[1]}
	want := map[EntryKind]int{KindDir: 3, KindFile: 4, KindWriteOnly: 3, KindUnreadable: 4, KindLink: 3}
	n, ok := want[e.Kind]
	if !ok {
		return Entry{}, fmt.Errorf("unknown entry kind %q", toks[0])
	}
	if len(toks) != n {
		return Entry{}, fmt.Errorf("%s %s: want %d fields, got %d", e.Kind, e.Path, n, len(toks))
	}
	switch e.Kind {
	case KindDir:
		d, err := time.ParseDuration(toks[2])
		if err != nil || d < 0 {
			return Entry{}, fmt.Errorf("dir %s: bad age %q", e.Path, toks[2])
		}
		e.Age = d
	case KindFile, KindWriteOnly, KindUnreadable:
		m, err := strconv.ParseUint(toks[2], 8, 32)
		if err != nil || m > 0o777 || len(toks[2]) != 4 {
			return Entry{}, fmt.Errorf("%s %s: bad mode %q", e.Kind, e.Path, toks[2])
		}
		e.Mode = fs.FileMode(m)
		if e.Kind == KindFile && !quoted[3] {
			return Entry{}, fmt.Errorf("file %s: value must be quoted", e.Path)
		}
		if len(toks) == 4 {
			e.Value = toks[3]
		}
	case KindLink:
		e.Target = toks[2]
		if e.Target == "" || strings.ContainsRune(e.Target, 0) {
			return Entry{}, fmt.Errorf("link %s: bad target", e.Path)
		}
	}
	return e, nil
}

// splitTokens splits a line on single spaces into bare or Go-quoted
// tokens. Encode never writes two spaces in a row, so Parse rejects them.
func splitTokens(line string) (toks []string, quoted []bool, err error) {
	for len(line) > 0 {
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				return nil, nil, fmt.Errorf("bad quoted field at %q", line)
			}
			s, err := strconv.Unquote(q)
			if err != nil {
				return nil, nil, fmt.Errorf("bad quoted field %s", q)
			}
			toks = append(toks, s)
			quoted = append(quoted, true)
			line = line[len(q):]
		} else {
			i := strings.IndexByte(line, ' ')
			if i < 0 {
				i = len(line)
			}
			tok := line[:i]
			if strings.ContainsAny(tok, "\"\\\t\r") {
				return nil, nil, fmt.Errorf("bad bare field %q", tok)
			}
			toks = append(toks, tok)
			quoted = append(quoted, false)
			line = line[i:]
		}
		if len(line) == 0 {
			break
		}
		if line[0] != ' ' || len(line) == 1 || line[1] == ' ' {
			return nil, nil, fmt.Errorf("fields must be separated by one space: %q", line)
		}
		line = line[1:]
	}
	return toks, quoted, nil
}

// Validate checks the invariants Parse promises: clean relative paths,
// no duplicates, nothing below a file or a link, sane link targets.
func (f *Fixture) Validate() error {
	kinds := make(map[string]EntryKind, len(f.Entries))
	for _, e := range f.Entries {
		if err := checkRelPath(e.Path); err != nil {
			return fmt.Errorf("%s %q: %w", e.Kind, e.Path, err)
		}
		if _, dup := kinds[e.Path]; dup {
			return fmt.Errorf("%s: duplicate entry", e.Path)
		}
		kinds[e.Path] = e.Kind
		if e.Kind == KindLink && path.IsAbs(e.Target) {
			return fmt.Errorf("link %s: absolute target %q", e.Path, e.Target)
		}
	}
	for _, e := range f.Entries {
		for p := path.Dir(e.Path); p != "."; p = path.Dir(p) {
			if k, ok := kinds[p]; ok && k != KindDir {
				return fmt.Errorf("%s: parent %s is a %s entry", e.Path, p, k)
			}
		}
	}
	return nil
}

func checkRelPath(p string) error {
	switch {
	case p == "" || p == ".":
		return errors.New("empty path")
	case path.IsAbs(p):
		return errors.New("absolute path")
	case path.Clean(p) != p:
		return errors.New("path not clean")
	case p == ".." || strings.HasPrefix(p, "../"):
		return errors.New("path escapes the root")
	case strings.ContainsRune(p, 0):
		return errors.New("NUL in path")
	}
	return nil
}
