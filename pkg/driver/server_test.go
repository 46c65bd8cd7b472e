package driver_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRun_GracefulStop: on shutdown an in-flight RPC completes, then Run
// returns and the socket is gone.
func TestRun_GracefulStop(t *testing.T) {
	env := newFakeEnv(t)
	env.attacher.attachIn = make(chan struct{})
	env.attacher.release = make(chan struct{})
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- env.driver.Run(ctx, "unix://"+sock, 10*time.Second) }()
	conn := dial(t, sock)
	node := csi.NewNodeClient(conn)

	staging := mkdir(t, env.dir, "staging")
	rpcErr := make(chan error, 1)
	go func() {
		_, err := node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
			VolumeId: "v", StagingTargetPath: staging,
			VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
			VolumeContext:    nvmeContext(),
		})
		rpcErr <- err
	}()
	<-env.attacher.attachIn
	cancel() // SIGTERM arrives while the stage is in flight
	time.Sleep(50 * time.Millisecond)
	close(env.attacher.release)
	if err := <-rpcErr; err != nil {
		t.Errorf("in-flight RPC failed during graceful stop: %v", err)
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestRun_StaleSocketRemoved: a socket file nobody serves (a crashed run)
// is replaced.
func TestRun_StaleSocketRemoved(t *testing.T) {
	env := newFakeEnv(t)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the file stays, nothing listens
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("stale socket not in place: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- env.driver.Run(ctx, "unix://"+sock, time.Second) }()
	conn := dial(t, sock)
	if _, err := csi.NewIdentityClient(conn).Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Errorf("Probe over the replaced socket: %v", err)
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestRun_LiveSocketIsAnError: a socket another process serves is never
// taken over.
func TestRun_LiveSocketIsAnError(t *testing.T) {
	env := newFakeEnv(t)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	err = env.driver.Run(context.Background(), "unix://"+sock, time.Second)
	if err == nil || !strings.Contains(err.Error(), "another running process") {
		t.Errorf("Run on a live socket: %v, want an error", err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("live socket was removed: %v", err)
	}
}

func TestRun_NotASocket(t *testing.T) {
	env := newFakeEnv(t)
	p := filepath.Join(t.TempDir(), "csi.sock")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := env.driver.Run(context.Background(), "unix://"+p, time.Second); err == nil {
		t.Error("Run replaced a regular file")
	}
}

// dial connects to a socket, waiting until the server is up.
func dial(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s never came up", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
