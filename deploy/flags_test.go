package deploy

import (
	"bufio"
	"bytes"
	"go/build"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
)

// flagsAheadOfBinary are flags the DaemonSet passes that `pathmend serve`
// does not define yet, each with what adds it. pathmend exits at start on
// an unknown flag, so an image without the flag crash-loops: this list
// must be empty when a release is tagged. An entry the binary has gained
// is only logged, so that landing the flag does not fail this test.
var flagsAheadOfBinary = map[string]string{}

// sidecarFlags are the flags of the pinned sidecar releases
// (node-driver-registrar v2.17, livenessprobe v2.19) that the manifests may
// use, so a misspelt one fails here rather than on a node.
var sidecarFlags = map[string][]string{
	registrarContainer: {"csi-address", "kubelet-registration-path", "plugin-registration-path", "http-endpoint", "timeout", "mode", "v"},
	livenessContainer:  {"csi-address", "http-endpoint", "probe-timeout", "metrics-path", "v"},
}

var (
	serveFlagsOnce sync.Once
	serveFlagsMap  map[string]string
	serveFlagsErr  string
)

// serveFlags builds pathmend and returns the flags `pathmend serve -h`
// lists, each with its default ("" when the usage shows none).
func serveFlags(t *testing.T) map[string]string {
	t.Helper()
	serveFlagsOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(build.Default.GOROOT, "bin", "go")
		}
		bin := filepath.Join(t.TempDir(), "pathmend")
		out, err := exec.Command(goBin, "build", "-o", bin, "github.com/pathmend/pathmend/cmd/pathmend").CombinedOutput()
		if err != nil {
			serveFlagsErr = "build pathmend: " + err.Error() + "\n" + string(out)
			return
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, "serve", "--help")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			serveFlagsErr = "pathmend serve --help: " + err.Error() + "\n" + stderr.String()
			return
		}
		serveFlagsMap = parseUsage(stdout.String())
	})
	if serveFlagsErr != "" {
		t.Fatal(serveFlagsErr)
	}
	return serveFlagsMap
}

var (
	usageFlag    = regexp.MustCompile(`^  --?(\S+)`)
	usageDefault = regexp.MustCompile(`\(default: (.*)\)$`)
)

// parseUsage reads the flags of `pathmend serve --help`: "  --name type"
// lines (one dash for a one-letter flag), each followed by an indented
// description whose last line may end in "(default: x)". Hidden flags
// are not listed, so they are not found.
func parseUsage(usage string) map[string]string {
	fl := map[string]string{}
	var last string
	sc := bufio.NewScanner(strings.NewReader(usage))
	for sc.Scan() {
		line := sc.Text()
		if m := usageFlag.FindStringSubmatch(line); m != nil {
			last = m[1]
			fl[last] = ""
			continue
		}
		if m := usageDefault.FindStringSubmatch(strings.TrimSpace(line)); m != nil && last != "" {
			fl[last] = m[1]
		}
	}
	return fl
}

func TestParseUsage(t *testing.T) {
	got := parseUsage("Usage:\n  pathmend serve [flags]\n\nCSI flags:\n  --driver-name string\n        CSI driver name (default: csi.pathmend.io)\n" +
		"  --attach-timeout duration\n        how long NodeStage waits for a namespace after connecting\n        (default: 15s)\n  -v N\n        log verbosity\n")
	want := map[string]string{"driver-name": "csi.pathmend.io", "attach-timeout": "15s", "v": ""}
	if !equalMaps(got, want) {
		t.Errorf("parseUsage = %v, want %v", got, want)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestInstall_PathmendFlagsExist: every flag the DaemonSet gives pathmend
// is one `pathmend serve` defines, with a value it accepts.
func TestInstall_PathmendFlagsExist(t *testing.T) {
	known := serveFlags(t)
	for name, why := range flagsAheadOfBinary {
		if _, ok := known[name]; ok {
			t.Logf("--%s is now defined by pathmend serve; remove it from flagsAheadOfBinary", name)
		} else {
			t.Logf("--%s is passed ahead of the binary: %s", name, why)
		}
	}
	forEachInstall(t, func(t *testing.T, in install) {
		pm := in.container(t, pluginContainer)
		fl, pos := flags(t, pm)
		if !slices.Equal(pos, []string{"serve"}) {
			t.Errorf("positional args %q, want [serve]", pos)
		}
		for name := range fl {
			if _, ok := known[name]; !ok && flagsAheadOfBinary[name] == "" {
				t.Errorf("--%s: pathmend serve has no such flag (and would exit at start)", name)
			}
		}
		if _, err := heal.ParseMode(fl["heal"]); err != nil {
			t.Errorf("--heal: %v", err)
		}
		for _, name := range []string{"shutdown-timeout", "monitor-interval", "connect-timeout", "attach-timeout", "heal-grace", "heal-cooldown"} {
			if v, ok := fl[name]; ok {
				if d, err := time.ParseDuration(v); err != nil || d <= 0 {
					t.Errorf("--%s=%s is not a positive duration", name, v)
				}
			}
		}
		if v, ok := fl["heal-max-scope"]; ok && v != "controller" && v != "subsystem" {
			t.Errorf("--heal-max-scope=%s, want controller or subsystem", v)
		}
	})
}

// TestInstall_SidecarFlagsExist catches a misspelt sidecar flag.
func TestInstall_SidecarFlagsExist(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		for name, known := range sidecarFlags {
			c := in.container(t, name)
			fl, pos := flags(t, c)
			if len(pos) > 0 {
				t.Errorf("container %s: positional args %q", name, pos)
			}
			for f := range fl {
				if !slices.Contains(known, f) {
					t.Errorf("container %s: unknown flag --%s", name, f)
				}
			}
		}
	})
}

// TestInstall_GracePeriodCoversShutdown: after SIGTERM pathmend lets
// in-flight RPCs run for --shutdown-timeout; kubelet must not kill it
// sooner.
func TestInstall_GracePeriodCoversShutdown(t *testing.T) {
	def := serveFlags(t)["shutdown-timeout"]
	forEachInstall(t, func(t *testing.T, in install) {
		v, ok := flagsOf(t, in.container(t, pluginContainer))["shutdown-timeout"]
		if !ok {
			v = def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("--shutdown-timeout=%s: %v", v, err)
		}
		g := in.pod.TerminationGracePeriodSeconds
		if g == nil || time.Duration(*g)*time.Second < d+10*time.Second {
			t.Errorf("terminationGracePeriodSeconds %v leaves no room after --shutdown-timeout=%s", g, d)
		}
	})
}
