package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServe_JSONLogsAreJSONLines runs `pathmend serve --log-format=json`
// to its graceful stop and parses every line it logged.
func TestServe_JSONLogsAreJSONLines(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	os.Mkdir(filepath.Join(dir, "sys"), 0o755)
	cmd := exec.Command(os.Args[0], "serve", "--log-format=json", "-v=4", "--endpoint=unix://"+sock,
		"--sys-root="+filepath.Join(dir, "sys"), "--dev-root="+dir, "--state-dir="+filepath.Join(dir, "state"),
		"--hostnqn-file="+filepath.Join(dir, "hostnqn"), "--hostid-file="+filepath.Join(dir, "hostid"), "--heal=observe")
	cmd.Env = append(os.Environ(), "PATHMEND_TEST_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never came up:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	lines, sawServing := 0, false
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		line := sc.Text()
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Errorf("not a JSON line: %q (%v)", line, err)
			continue
		}
		lines++
		if obj["msg"] == "Serving CSI" {
			sawServing = true
			if obj["endpoint"] != "unix://"+sock || obj["ts"] == nil {
				t.Errorf("structured keys missing: %v", obj)
			}
		}
	}
	if lines == 0 || !sawServing {
		t.Errorf("%d JSON lines, Serving CSI seen: %t\n%s", lines, sawServing, stderr.String())
	}
	if strings.Contains(stderr.String(), "\nI1") {
		t.Error("klog text lines mixed into JSON output")
	}
}
