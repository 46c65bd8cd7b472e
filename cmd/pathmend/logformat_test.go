package main

import (
	"bufio"
	"strings"
	"syscall"
	"testing"

	"github.com/pathmend/pathmend/internal/logjson/logjsontest"
)

// serveJSONLines runs `pathmend serve` with the flags to its graceful
// stop and parses every line it logged with the Kubernetes JSON parser.
func serveJSONLines(t *testing.T, flags ...string) []logjsontest.Line {
	t.Helper()
	cmd, stderr, _ := startServe(t, flags...)
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	var lines []logjsontest.Line
	sc := bufio.NewScanner(strings.NewReader(stderr.String()))
	for sc.Scan() {
		l, err := logjsontest.Parse(sc.Text())
		if err != nil {
			t.Errorf("%v\nline: %s", err, sc.Text())
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		t.Fatalf("no JSON lines:\n%s", stderr.String())
	}
	return lines
}

// TestServe_LoggingFormatJSONIsTheKubernetesSchema runs `pathmend serve
// --logging-format=json`: every line is the schema kubelet and the CSI
// sidecars write (internal/logjson), with the structured keys of the call.
func TestServe_LoggingFormatJSONIsTheKubernetesSchema(t *testing.T) {
	lines := serveJSONLines(t, "--logging-format=json", "-v=4")
	sawServing := false
	for _, l := range lines {
		if l.Msg == "Serving CSI" {
			sawServing = true
			if l.V == nil || *l.V != 0 || !strings.HasPrefix(l.Values["endpoint"].(string), "unix://") || !strings.HasPrefix(l.Caller, "driver/") {
				t.Errorf("Serving CSI line: %+v", l)
			}
		}
		if strings.Contains(l.Msg, "deprecated") {
			t.Errorf("deprecation warning without the deprecated flag: %+v", l)
		}
	}
	if !sawServing {
		t.Errorf("no Serving CSI line in %d lines", len(lines))
	}
}

// TestServe_LogFormatIsADeprecatedAlias: the old --log-format=json still
// selects the JSON schema and says it is deprecated.
func TestServe_LogFormatIsADeprecatedAlias(t *testing.T) {
	lines := serveJSONLines(t, "--log-format=json")
	if !strings.Contains(lines[0].Msg, "--log-format is deprecated") || !strings.Contains(lines[0].Msg, "--logging-format") {
		t.Errorf("first line %+v: want the deprecation of --log-format", lines[0])
	}
}
