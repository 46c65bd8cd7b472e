package deploy

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile_BuildStageBuildsTheStampedStaticBinary runs the
// Dockerfile's build command exactly as written — no Docker engine needed —
// with VERSION from deploy/VERSION, and checks that the result is a static
// binary reporting that version: what the image will carry.
func TestDockerfile_BuildStageBuildsTheStampedStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .*-o /out/pathmend \./cmd/pathmend)$`).FindStringSubmatch(string(df))
	if m == nil {
		t.Fatal("Dockerfile has no `RUN CGO_ENABLED=0 go build … -o /out/pathmend ./cmd/pathmend` line")
	}
	version := readVersion(t)
	out := filepath.Join(t.TempDir(), "pathmend")
	cmdline := strings.ReplaceAll(strings.ReplaceAll(m[1], "${VERSION}", version), "/out/pathmend", out)
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, b)
	}
	got, err := exec.Command(out, "version").Output()
	if err != nil || strings.TrimSpace(string(got)) != version {
		t.Errorf("pathmend version = %q, %v; want %s", got, err, version)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary is dynamically linked (%v): the runtime image has no Go toolchain libc guarantees", p.Type)
		}
	}
}
