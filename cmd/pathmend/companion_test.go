package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// TestCompanion_TheBuiltBinaryLearnsAndServesHealth: `pathmend companion`
// as built, on the healthy capture: no CSI socket, /healthz answers once
// a tick ran, the capture's subsystems are learned into the state dir
// (0600 files), no CSI socket is made, and SIGTERM
// stops it with status 0.
func TestCompanion_TheBuiltBinaryLearnsAndServesHealth(t *testing.T) {
	dir := t.TempDir()
	bin := buildPathmend(t, dir)
	sys := filepath.Join(dir, "sys")
	if err := os.Mkdir(sys, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sysfstest.Materialize(filepath.Join(fixtureDir, "nvme-healthy.sysfs"), sys, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	log := &lockedBuffer{}
	cmd := exec.Command(bin, "companion", "--sys-root="+sys, "--dev-root="+dir, "--state-dir="+state,
		"--metrics-address=127.0.0.1:0", "--monitor-interval=100ms", "-v=2")
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	addrRE := regexp.MustCompile(`"Serving metrics and health" address="([^"]+)"`)
	var addr string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(log.String()); m != nil && addr == "" {
			addr = m[1]
		}
		if addr != "" {
			if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("pathmend companion exited: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no healthy /healthz within 30s:\n%s", log.String())
		}
	}
	var subs map[string]companion.Subsystem
	for deadline := time.Now().Add(10 * time.Second); len(subs) < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s, ok, err := companion.OpenStore(state)
		if err != nil || !ok {
			continue
		}
		subs, _, _ = s.Load()
	}
	if len(subs) != 2 || len(subs["nqn.2024-01.io.pathmend.lab:healthy-a"].Endpoints) != 2 {
		t.Fatalf("learned %+v, want the capture's two subsystems with two endpoints each", subs)
	}
	files, _ := filepath.Glob(filepath.Join(state, "learned", "sub-*.json"))
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", f, fi.Mode().Perm(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "csi.sock")); err == nil {
		t.Error("companion mode created a CSI socket")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, log.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("pathmend companion did not stop within 15s of SIGTERM")
	}
	if !strings.Contains(log.String(), `"Companion mode started" mode="observe"`) {
		t.Errorf("log lacks the start line:\n%s", log.String())
	}
}

// TestCompanion_BadFlagsNameTheFlag: a bad --forget-after is refused by
// `pathmend companion` and by `serve --heal-foreign` (and ignored by
// serve without it); an unknown flag is bad usage.
func TestCompanion_BadFlagsNameTheFlag(t *testing.T) {
	c := defaultServeConfig()
	c.foreign.forgetAfter = 0
	if err := c.validate(); err != nil {
		t.Errorf("serve without --heal-foreign: %v", err)
	}
	c.healForeign = true
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "--forget-after") {
		t.Errorf("serve --heal-foreign --forget-after=0: %v, want it to name --forget-after", err)
	}
	var stdout, stderr strings.Builder
	if code := run([]string{"companion", "--forget-after=0s", "--state-dir=" + t.TempDir(), "--sys-root=" + t.TempDir()}, &stdout, &stderr); code != 1 {
		t.Errorf("companion --forget-after=0s: exit %d, want 1", code)
	}
	if code := run([]string{"companion", "--endpoint=unix:///x.sock"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "endpoint") {
		t.Errorf("companion --endpoint: exit %d (%s), want 2: companion mode has no CSI socket", code, stderr.String())
	}
}
