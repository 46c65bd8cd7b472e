package main

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func runOut(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelp_TopLevelListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errOut := runOut(args...)
		if code != 0 || errOut != "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
		if strings.Contains(out, "Usage of") || strings.Contains(out, "--endpoint") {
			t.Errorf("%v prints serve's flags instead of the command list:\n%s", args, out)
		}
		for _, c := range commands() {
			if !strings.Contains(out, "\n  "+c.name+" ") {
				t.Errorf("%v: command %s not listed:\n%s", args, c.name, out)
			}
		}
	}
}

// TestHelp_EveryCommand: `pathmend NAME --help` and `pathmend help NAME`
// print the same help on stdout, with a synopsis, a description, exit
// status where the command has one, and every visible flag in a group.
func TestHelp_EveryCommand(t *testing.T) {
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runOut(c.name, "--help")
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			code2, out2, _ := runOut("help", c.name)
			if code2 != 0 {
				t.Errorf("help %s: exit %d", c.name, code2)
			}
			if diff := cmp.Diff(out, out2); diff != "" {
				t.Errorf("help %s differs from %s --help:\n%s", c.name, c.name, diff)
			}
			if !strings.HasPrefix(out, "Usage:\n  pathmend "+c.name) {
				t.Errorf("no synopsis first:\n%s", out)
			}
			if !strings.Contains(out, strings.TrimSpace(c.description)[:40]) {
				t.Errorf("no description:\n%s", out)
			}
			if strings.Contains(out, "Other flags:") {
				t.Errorf("a flag of %s is in no group of its help (add it to the command's groups):\n%s", c.name, out)
			}
			for _, e := range c.exitCodes {
				if !strings.Contains(out, "Exit status:") || !strings.Contains(out, wrap(e.meaning, 72)[0]) {
					t.Errorf("exit status %d not explained:\n%s", e.code, out)
				}
			}
		})
	}
}

func TestHelp_ServeHidesLegacyKlogFlagsAndTheBuildHost(t *testing.T) {
	_, out, _ := runOut("serve", "--help")
	for _, legacy := range []string{"log_dir", "logtostderr", "alsologtostderr", "log_file", "skip_headers", "stderrthreshold", "one_output", "add_dir_header", "log-format"} {
		if strings.Contains(out, "-"+legacy) {
			t.Errorf("help lists the hidden flag %s", legacy)
		}
	}
	for _, kept := range []string{"\n  -v N\n", "\n  --vmodule ", "\n  --logging-format string\n", "(default: the node's hostname"} {
		if !strings.Contains(out, kept) {
			t.Errorf("help lacks %q", kept)
		}
	}
	if h, err := os.Hostname(); err == nil && len(h) > 3 && strings.Contains(out, h) {
		t.Errorf("help shows this machine's host name %q as a default", h)
	}
	if !strings.Contains(out, "Exit status:") {
		t.Error("serve help has no exit status")
	}
}

func TestResolveNodeID(t *testing.T) {
	host := func(h string, err error) func() (string, error) {
		return func() (string, error) { return h, err }
	}
	for _, tc := range []struct {
		flag    string
		host    func() (string, error)
		want    string
		wantErr string
	}{
		{flag: "n1", host: host("", errors.New("unused")), want: "n1"},
		{flag: "", host: host("node-a", nil), want: "node-a"},
		{flag: "", host: host("", errors.New("uts")), wantErr: "uts"},
		{flag: "", host: host("", nil), wantErr: "host name is empty"},
	} {
		got, err := resolveNodeID(tc.flag, tc.host)
		if got != tc.want || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("resolveNodeID(%q) = %q, %v; want %q, %q", tc.flag, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestDiagnose_NotASysfsRootIsAnError: a mistyped --sys-root, or a
// container without /sys (an empty directory), is exit 2 naming the path,
// never "No defects."; a node without NVMe or iSCSI modules (class/ and
// devices/ only) is healthy.
func TestDiagnose_NotASysfsRootIsAnError(t *testing.T) {
	dir := t.TempDir()
	empty := dir + "/empty"
	bare := dir + "/bare"
	for _, d := range []string{empty, bare + "/class", bare + "/devices"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		root     string
		code     int
		stderrIn string
	}{
		{root: dir + "/nonexistent", code: diagnoseError, stderrIn: dir + "/nonexistent"},
		{root: empty, code: diagnoseError, stderrIn: empty + " has no class/ directory"},
		{root: bare, code: diagnoseHealthy},
	} {
		code, out, errOut := runOut("diagnose", "--sys-root="+tc.root, "--state-dir=", "--json")
		if code != tc.code || !strings.Contains(errOut, tc.stderrIn) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.root, code, errOut, tc.code, tc.stderrIn)
		}
		if tc.code == diagnoseError && out != "" {
			t.Errorf("%s: stdout %q on error", tc.root, out)
		}
		if tc.code == diagnoseHealthy && !strings.Contains(out, `"healthy": true`) {
			t.Errorf("%s: %s", tc.root, out)
		}
	}
}

// TestRun_NoCommandServesNothing: `pathmend` alone, or flags with no
// command before them, prints the usage on stderr and exits 2 without
// starting any command (serve would create the host NQN, the state
// directory and the socket on the machine it runs on).
func TestRun_NoCommandServesNothing(t *testing.T) {
	for _, args := range [][]string{nil, {}, {"--endpoint=unix:///tmp/x.sock"}, {"-v=5", "serve"}} {
		code, out, errOut := runOut(args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if out != "" {
			t.Errorf("%q: wrote to stdout: %q", args, out)
		}
		if !strings.Contains(errOut, "Usage:\n  pathmend COMMAND [flags]") {
			t.Errorf("%q: no usage on stderr:\n%s", args, errOut)
		}
		for _, c := range commands() {
			if !strings.Contains(errOut, "\n  "+c.name+" ") {
				t.Errorf("%q: command %s not listed:\n%s", args, c.name, errOut)
			}
		}
		if len(args) > 0 && !strings.Contains(errOut, "pathmend serve "+args[0]) {
			t.Errorf("%q: the error does not show where the flags go:\n%s", args, errOut)
		}
	}
}
