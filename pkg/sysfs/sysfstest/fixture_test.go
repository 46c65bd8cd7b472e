package sysfstest

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

const sampleFixture = `# pathmend sysfs fixture v1
# scenario: sample
#
# expect: one live controller
dir class 1m0s
dir class/nvme 1m0s
link class/nvme/nvme0 ../../devices/virtual/nvme-fabrics/ctl/nvme0
dir devices 1m0s
dir devices/virtual 1m0s
dir devices/virtual/nvme-fabrics 1m0s
dir devices/virtual/nvme-fabrics/ctl 30s
dir devices/virtual/nvme-fabrics/ctl/nvme0 12.345s
file devices/virtual/nvme-fabrics/ctl/nvme0/address 0444 "traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1\n"
file devices/virtual/nvme-fabrics/ctl/nvme0/ctrl_loss_tmo 0644 "600\n"
wo devices/virtual/nvme-fabrics/ctl/nvme0/delete_controller 0200
file devices/virtual/nvme-fabrics/ctl/nvme0/model 0444 "pathmend-lab                            \n"
file devices/virtual/nvme-fabrics/ctl/nvme0/state 0444 "live\n"
file devices/virtual/nvme-fabrics/ctl/nvme0/vpd 0444 "\x00\x83\xff"
err devices/virtual/nvme-fabrics/ctl/nvme0/broken 0444 ENOTCONN
link devices/virtual/nvme-fabrics/ctl/nvme0/subsystem ../../../../../class/nvme
dir "devices/virtual/with space" 0s
`

func mustParse(t *testing.T, s string) *Fixture {
	t.Helper()
	f, err := ParseFixture(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestParseFixture_ReadsEveryEntryKind(t *testing.T) {
	f := mustParse(t, sampleFixture)
	if diff := cmp.Diff([]string{"scenario: sample", "", "expect: one live controller"}, f.Comments); diff != "" {
		t.Errorf("comments (-want +got):\n%s", diff)
	}
	want := map[string]Entry{
		"class/nvme/nvme0": {Kind: KindLink, Path: "class/nvme/nvme0", Target: "../../devices/virtual/nvme-fabrics/ctl/nvme0"},
		"devices/virtual/nvme-fabrics/ctl/nvme0": {Kind: KindDir, Path: "devices/virtual/nvme-fabrics/ctl/nvme0",
			Age: 12345 * time.Millisecond},
		"devices/virtual/nvme-fabrics/ctl/nvme0/state": {Kind: KindFile, Path: "devices/virtual/nvme-fabrics/ctl/nvme0/state",
			Mode: 0o444, Value: "live\n"},
		"devices/virtual/nvme-fabrics/ctl/nvme0/vpd": {Kind: KindFile, Path: "devices/virtual/nvme-fabrics/ctl/nvme0/vpd",
			Mode: 0o444, Value: "\x00\x83\xff"},
		"devices/virtual/nvme-fabrics/ctl/nvme0/delete_controller": {Kind: KindWriteOnly,
			Path: "devices/virtual/nvme-fabrics/ctl/nvme0/delete_controller", Mode: 0o200},
		"devices/virtual/nvme-fabrics/ctl/nvme0/broken": {Kind: KindUnreadable,
			Path: "devices/virtual/nvme-fabrics/ctl/nvme0/broken", Mode: 0o444, Value: "ENOTCONN"},
		"devices/virtual/with space": {Kind: KindDir, Path: "devices/virtual/with space"},
	}
	for p, w := range want {
		got, ok := f.Lookup(p)
		if !ok {
			t.Errorf("no entry %s", p)
			continue
		}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", p, diff)
		}
	}
}

func TestFixture_EncodeRoundTripsExactly(t *testing.T) {
	f := mustParse(t, sampleFixture)
	b, err := f.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sampleFixture, string(b)); diff != "" {
		t.Errorf("encode(parse(x)) != x (-want +got):\n%s", diff)
	}
	g := mustParse(t, string(b))
	if diff := cmp.Diff(f, g); diff != "" {
		t.Errorf("parse(encode(f)) != f (-want +got):\n%s", diff)
	}
}

func TestParseFixture_RejectsBadInput(t *testing.T) {
	head := FixtureMagic + "\n"
	cases := map[string]string{
		"no magic":            "dir a 1s\n",
		"other version":       "# pathmend sysfs fixture v2\n",
		"empty":               "",
		"unknown kind":        head + "sock a\n",
		"absolute path":       head + "dir /a 1s\n",
		"dotdot":              head + "dir ../a 1s\n",
		"unclean":             head + "dir a/./b 1s\n",
		"duplicate":           head + "dir a 1s\ndir a 2s\n",
		"negative age":        head + "dir a -1s\n",
		"bad age":             head + "dir a soon\n",
		"bad mode":            head + "file a 644 \"x\"\n",
		"mode too big":        head + "file a 1777 \"x\"\n",
		"unquoted value":      head + "file a 0444 live\n",
		"missing field":       head + "file a 0444\n",
		"extra field":         head + "wo a 0200 x\n",
		"double space":        head + "dir  a 1s\n",
		"trailing space":      head + "dir a 1s \n",
		"child of file":       head + "file a 0444 \"x\"\ndir a/b 1s\n",
		"child of link":       head + "link a b\nfile a/c 0444 \"x\"\n",
		"absolute link":       head + "link a /sys/b\n",
		"bad quoting":         head + "file a 0444 \"x\n",
		"backslash in bare":   head + "dir a\\b 1s\n",
		"line too long":       head + "file a 0444 \"" + strings.Repeat("x", maxFixtureLine) + "\"\n",
		"empty quoted target": head + "link a \"\"\n",
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if f, err := ParseFixture(strings.NewReader(in)); err == nil {
				t.Errorf("ParseFixture accepted %q: %+v", in, f)
			}
		})
	}
}

func TestFixture_EncodeRefusesMultiLineComments(t *testing.T) {
	f := &Fixture{Comments: []string{"kernel: 6.1 (Debian 12.2.0-14)\nDebian 6.1.192-3)"}}
	if b, err := f.Bytes(); err == nil {
		t.Fatalf("Encode wrote a comment spanning lines:\n%s", b)
	}
}

func TestMaterialize_RestoresTreeLinksModesAndAges(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fx := filepath.Join(t.TempDir(), "sample.sysfs")
	if err := os.WriteFile(fx, []byte(sampleFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Materialize(fx, dir, now); err != nil {
		t.Fatal(err)
	}
	sys := sysfs.New(dir)

	// Reads go through the class symlink like on a node.
	if v, err := sys.ReadAttr("class/nvme/nvme0/state"); err != nil || v != "live" {
		t.Errorf("state = %q, %v", v, err)
	}
	if v, err := sys.ReadAttr("class/nvme/nvme0/model"); err != nil || v != "pathmend-lab" {
		t.Errorf("model = %q, %v", v, err)
	}
	if l, err := sys.ReadLink("class/nvme/nvme0"); err != nil || l != "../../devices/virtual/nvme-fabrics/ctl/nvme0" {
		t.Errorf("link = %q, %v", l, err)
	}

	// A controller directory's mtime is capture-relative.
	fi, err := sys.Stat("class/nvme/nvme0")
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(-12345 * time.Millisecond); !fi.ModTime().Equal(want) {
		t.Errorf("controller mtime = %s, want %s", fi.ModTime(), want)
	}

	// Modes as recorded; a write-only attribute takes a write a test can
	// read back.
	for rel, want := range map[string]fs.FileMode{
		"devices/virtual/nvme-fabrics/ctl/nvme0/state":             0o444,
		"devices/virtual/nvme-fabrics/ctl/nvme0/ctrl_loss_tmo":     0o644,
		"devices/virtual/nvme-fabrics/ctl/nvme0/delete_controller": 0o200,
		"devices/virtual/nvme-fabrics/ctl/nvme0/broken":            0,
	} {
		fi, err := os.Lstat(sys.Path(rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want || !fi.Mode().IsRegular() {
			t.Errorf("%s mode = %s, want regular %s", rel, fi.Mode(), want)
		}
	}
	if err := sys.WriteAttr("class/nvme/nvme0/delete_controller", "1"); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		b, err := os.ReadFile(sys.Path("class/nvme/nvme0/delete_controller"))
		if err != nil || string(b) != "1" {
			t.Errorf("written delete_controller = %q, %v", b, err)
		}
	} else if _, err := sys.ReadAttr("class/nvme/nvme0/broken"); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("unreadable attribute read: %v, want a permission error", err)
	}
}

func TestMaterialize_RefusesLinksLeavingTheTree(t *testing.T) {
	f := mustParse(t, FixtureMagic+"\ndir a 1s\nlink a/b ../../etc\n")
	if err := f.Materialize(t.TempDir(), time.Now()); err == nil {
		t.Fatal("Materialize accepted a link out of the tree")
	}
}

func TestMaterialize_NeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := mustParse(t, FixtureMagic+"\nfile a 0444 \"x\"\n")
	if err := f.Materialize(dir, time.Now()); err == nil {
		t.Fatal("Materialize overwrote an existing file")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a")); !bytes.Equal(b, []byte("keep")) {
		t.Errorf("existing file changed to %q", b)
	}
}

// TestCommittedFixtures_ParseRoundTripAndMaterialize checks every fixture
// captured in the lab: it parses, re-encodes byte for byte and
// materializes.
func TestCommittedFixtures_ParseRoundTripAndMaterialize(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/fixtures/*.sysfs")
	if len(paths) == 0 {
		t.Skip("no committed fixtures")
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f := mustParse(t, string(raw))
			b, err := f.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, raw) {
				t.Errorf("re-encoding %s changed it", p)
			}
			if err := f.Materialize(t.TempDir(), time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
