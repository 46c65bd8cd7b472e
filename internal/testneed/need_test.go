package testneed

import (
	"os/exec"
	"testing"
)

// fakeT records what Skip did instead of ending a real test.
type fakeT struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Skip(args ...any) {
	f.skipped = true
	f.msg = args[0].(string)
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = format
}

func TestSkip_SkipsLocallyAndFailsInCI(t *testing.T) {
	for _, ci := range []string{"", "false", "true"} {
		t.Setenv("CI", ci)
		f := &fakeT{}
		Skip(f, "needs %s", "promtool")
		if f.failed != (ci == "true") || f.skipped == (ci == "true") {
			t.Errorf("CI=%q: skipped %t, failed %t", ci, f.skipped, f.failed)
		}
	}
}

func TestTools_FindsAndReportsTheDebianPackage(t *testing.T) {
	t.Setenv("CI", "")
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeT{}
	if got := Tools(f, nil, "sh"); got[0] != sh || f.skipped {
		t.Errorf("Tools(sh) = %v, skipped %t", got, f.skipped)
	}
	f = &fakeT{}
	Tools(f, map[string]string{"no-such-tool-pathmend": "pathmend-tools"}, "no-such-tool-pathmend")
	if !f.skipped || f.msg == "" {
		t.Errorf("missing tool: skipped %t, msg %q", f.skipped, f.msg)
	}
}
