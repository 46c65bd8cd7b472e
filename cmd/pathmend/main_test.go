package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestRun_Commands(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		stdout   string
		stderrIn string
	}{
		{args: []string{"version"}, code: 0, stdout: buildVersion()},
		{args: []string{"help"}, code: 0, stdout: "pathmend COMMAND [flags]"},
		{args: []string{"--help"}, code: 0, stdout: "pathmend COMMAND [flags]"},
		{args: []string{"help", "frobnicate"}, code: 2, stderrIn: `unknown command "frobnicate"`},
		{args: []string{"version", "extra"}, code: 2, stderrIn: "unexpected arguments"},
		// klog's legacy flags stay accepted (hidden): the run gets as far
		// as validating the endpoint.
		{args: []string{"serve", "--logtostderr", "--log_file_max_size=10", "--endpoint=tcp://127.0.0.1:1"}, code: 1},
		{args: []string{"serve", "--logging-format=xml"}, code: 2, stderrIn: `--logging-format "xml"`},
		{args: []string{"frobnicate"}, code: 2, stderrIn: `unknown command "frobnicate"`},
		{args: []string{"serve", "--no-such-flag"}, code: 2, stderrIn: "no-such-flag"},
		{args: []string{"serve", "extra"}, code: 2, stderrIn: "unexpected arguments"},
		{args: []string{"serve", "--heal=fix", "--endpoint=unix:///tmp/x.sock"}, code: 1},
		{args: []string{"serve", "--endpoint=tcp://127.0.0.1:1"}, code: 1},
		// No command: nothing runs.
		{args: []string{"--heal=fix", "--endpoint=unix:///tmp/x.sock"}, code: 2, stderrIn: "no command before --heal=fix"},
		{args: nil, code: 2, stderrIn: "pathmend COMMAND [flags]"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(tc.args, &out, &errb); got != tc.code {
				t.Errorf("exit = %d, want %d (stderr %q)", got, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.stdout)
			}
			if !strings.Contains(errb.String(), tc.stderrIn) {
				t.Errorf("stderr %q does not contain %q", errb.String(), tc.stderrIn)
			}
		})
	}
}

func TestServeConfig_Validate(t *testing.T) {
	c := defaultServeConfig()
	if err := c.validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	c.heal = "sometimes"
	c.endpoint = "/no/scheme"
	c.shutdownTimeout = 0
	c.stateDir = ""
	err := c.validate()
	for _, want := range []string{"--heal", "--endpoint", "--shutdown-timeout", "--state-dir"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate() = %v, want it to name %s", err, want)
		}
	}
}

// startServe runs the test binary as `pathmend serve` on a fresh socket,
// sysfs root, state dir and host identity files in a temp dir, with extra
// flags appended, and waits for its socket. The process is killed at the
// end of the test if it is still running.
func startServe(t *testing.T, extra ...string) (*exec.Cmd, *bytes.Buffer, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	os.Mkdir(filepath.Join(dir, "sys"), 0o755)
	args := append([]string{"serve", "--endpoint=unix://" + sock, "--sys-root=" + filepath.Join(dir, "sys"),
		"--dev-root=" + dir, "--state-dir=" + filepath.Join(dir, "state"), "--heal=observe",
		"--hostnqn-file=" + filepath.Join(dir, "hostnqn"), "--hostid-file=" + filepath.Join(dir, "hostid")}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "PATHMEND_TEST_MAIN=1")
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return cmd, stderr, sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never came up; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMain lets the test binary act as pathmend for TestServe_SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("PATHMEND_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestServe_SIGTERM runs `pathmend serve` as a process: it answers Probe
// on its socket, and on SIGTERM exits 0 and removes the socket.
func TestServe_SIGTERM(t *testing.T) {
	cmd, stderr, sock := startServe(t, "--node-id=n1", "--metrics-address=127.0.0.1:0")
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("Probe = %v, %v", probe, err)
	}
	info, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.GetNodeId() != "n1" {
		t.Fatalf("NodeGetInfo = %v, %v", info, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("pathmend did not exit after SIGTERM")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after SIGTERM: %v", err)
	}
}
