package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
)

// TestServe_JSONLogsAreJSONLines runs `pathmend serve --log-format=json`
// to its graceful stop and parses every line it logged.
func TestServe_JSONLogsAreJSONLines(t *testing.T) {
	cmd, stderr, sock := startServe(t, "--log-format=json", "-v=4")
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	lines, sawServing := 0, false
	sc := bufio.NewScanner(stderr)
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
