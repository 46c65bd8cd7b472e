//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startPathmend runs `pathmend serve` on a fresh socket and state dir
// against the guest's real /sys and /dev, stops it in t.Cleanup and
// returns a client connection. extra flags follow the defaults, so they
// override them (the flag package keeps the last value).
func startPathmend(t *testing.T, l lab, nodeID string, extra ...string) *grpc.ClientConn {
	t.Helper()
	conn, _ := startPathmendLog(t, l, nodeID, extra...)
	return conn
}

// startPathmendLog is startPathmend that also returns the path of
// pathmend's log, so a test can assert on the "Heal verdict" lines.
func startPathmendLog(t *testing.T, l lab, nodeID string, extra ...string) (*grpc.ClientConn, string) {
	t.Helper()
	p := startPathmendIn(t, l, t.TempDir(), nodeID, extra...)
	return p.conn, p.logPath
}

// pathmendProc is one `pathmend serve` process.
type pathmendProc struct {
	conn    *grpc.ClientConn
	logPath string
	stop    func() // SIGINT, wait (at most 15 s); idempotent
	kill    func() // SIGKILL, wait: pathmend crashed
}

// startPathmendIn runs `pathmend serve` with its socket and state dir in
// dir (created when missing, kept when there: a second process in the same
// dir is pathmend restarted on the node) and its log in the first free
// dir/pathmend[-N].log. It is stopped in t.Cleanup at the latest.
func startPathmendIn(t *testing.T, l lab, dir, nodeID string, extra ...string) *pathmendProc {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "pathmend.log")
	for n := 2; fileExists(logPath); n++ {
		logPath = filepath.Join(dir, fmt.Sprintf("pathmend-%d.log", n))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Every test stages and publishes under the temp dir, which stands in
	// for kubelet's root directory.
	args := append([]string{"serve",
		"--endpoint", "unix://" + sock, "--node-id", nodeID,
		"--sys-root", "/sys", "--dev-root", "/dev", "--state-dir", state,
		"--kubelet-root", os.TempDir(), "--heal=observe", "-v=4"}, extra...)
	cmd := exec.Command(l.bin("pathmend"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when the process is gone; waitErr is then set.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("pathmend did not stop within 2 min of SIGINT")
			}
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("pathmend log %s:\n%s", filepath.Base(logPath), b)
			}
		})
	}
	t.Cleanup(stop)
	eventually(t, 4*time.Minute, "pathmend's socket", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("pathmend exited early: %v\n%s", waitErr, b)
		default:
		}
		// Connect, not stat: a pathmend SIGKILLed before this one left
		// its socket file behind, which refuses connections until the
		// new process replaced it.
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	kill := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	return &pathmendProc{conn: conn, logPath: logPath, stop: stop, kill: kill}
}

func TestIdentity_PathmendServesPluginInfoProbeAndNodeInfo(t *testing.T) {
	l := needLab(t)
	conn := startPathmend(t, l, "lab-node-1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	id := csi.NewIdentityClient(conn)
	info, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}
	if info.GetName() == "" || !strings.Contains(info.GetName(), ".") {
		t.Errorf("GetPluginInfo name = %q, want a DNS-style driver name", info.GetName())
	}
	if info.GetVendorVersion() == "" {
		t.Error("GetPluginInfo vendor_version is empty")
	}

	probe, err := id.Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if r := probe.GetReady(); r != nil && !r.GetValue() {
		t.Errorf("Probe ready = false with a readable /sys and a writable state dir")
	}

	ni, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatalf("NodeGetInfo: %v", err)
	}
	if ni.GetNodeId() != "lab-node-1" {
		t.Errorf("NodeGetInfo node_id = %q, want %q", ni.GetNodeId(), "lab-node-1")
	}
	t.Logf("plugin %s %s, node %s", info.GetName(), info.GetVendorVersion(), ni.GetNodeId())
}
