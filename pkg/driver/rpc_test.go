package driver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"flag"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

func TestIdentity(t *testing.T) {
	env := newFakeEnv(t)
	ctx := context.Background()
	info, err := env.driver.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "csi.pathmend.io" || info.GetVendorVersion() != "v0.0.0-test" {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := env.driver.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caps.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			t.Error("a node plugin must not advertise CONTROLLER_SERVICE")
		}
	}
	probe, err := env.driver.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Errorf("Probe on a readable sysfs and writable state dir = %v, %v; want ready", probe, err)
	}
}

func TestProbe_NotReady(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(sysRoot, stateDir string)
	}{
		{"sysfs root missing", func(sysRoot, _ string) { os.RemoveAll(sysRoot) }},
		{"state dir gone", func(_, stateDir string) { os.RemoveAll(stateDir) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sysRoot := filepath.Join(dir, "sys")
			stateDir := filepath.Join(dir, "state")
			os.MkdirAll(sysRoot, 0o755)
			store, err := volume.NewStore(stateDir)
			if err != nil {
				t.Fatal(err)
			}
			d := newDriverWith(t, sysfs.New(sysRoot), store, &fakeAttacher{})
			tc.break_(sysRoot, stateDir)
			probe, err := d.Probe(context.Background(), &csi.ProbeRequest{})
			if err != nil || probe.GetReady().GetValue() {
				t.Errorf("Probe = %v, %v; want not ready", probe, err)
			}
		})
	}
}

func TestNodeGetInfo(t *testing.T) {
	env := newFakeEnv(t)
	info, err := env.driver.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil || info.GetNodeId() != "node-1" || info.GetAccessibleTopology() != nil || info.GetMaxVolumesPerNode() != 0 {
		t.Errorf("NodeGetInfo = %v, %v", info, err)
	}
	cfg := testConfig("ext4")
	cfg.TopologyKey, cfg.TopologyValue, cfg.MaxVolumesPerNode = "topology.pathmend.io/zone", "z1", 64
	d, err := driver.New(cfg, depsFor(t, &fakeAttacher{}))
	if err != nil {
		t.Fatal(err)
	}
	info, err = d.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil || info.GetAccessibleTopology().GetSegments()["topology.pathmend.io/zone"] != "z1" || info.GetMaxVolumesPerNode() != 64 {
		t.Errorf("NodeGetInfo with topology = %v, %v", info, err)
	}
}

func TestNew_RejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*driver.Config)
	}{
		{"no name", func(c *driver.Config) { c.DriverName = "" }},
		{"no node id", func(c *driver.Config) { c.NodeID = "" }},
		{"negative max volumes", func(c *driver.Config) { c.MaxVolumesPerNode = -1 }},
		{"topology key without value", func(c *driver.Config) { c.TopologyKey = "k" }},
		{"bad heal mode", func(c *driver.Config) { c.HealMode = "fix" }},
		{"bad default fs", func(c *driver.Config) { c.DefaultFSType = "zfs" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("ext4")
			tc.mutate(&cfg)
			if _, err := driver.New(cfg, depsFor(t, &fakeAttacher{})); err == nil {
				t.Error("New accepted a bad config")
			}
		})
	}
	deps := depsFor(t, &fakeAttacher{})
	delete(deps.Attachers, volume.TransportISCSI)
	if _, err := driver.New(testConfig("ext4"), deps); err == nil || !strings.Contains(err.Error(), "iscsi") {
		t.Errorf("New without an iscsi attacher: %v", err)
	}
}

// TestConcurrentSameVolume_Aborted: a second RPC on a volume with one in
// flight is Aborted at once; another volume is not held up.
func TestConcurrentSameVolume_Aborted(t *testing.T) {
	env := newFakeEnv(t)
	env.attacher.attachIn = make(chan struct{})
	env.attacher.release = make(chan struct{})
	staging := mkdir(t, env.dir, "staging")
	req := &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), VolumeContext: nvmeContext()}
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	var firstErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, firstErr = env.driver.NodeStageVolume(context.Background(), req)
	}()
	<-env.attacher.attachIn // the first stage holds the volume

	for name, call := range map[string]func() error{
		"stage": func() error { _, err := env.driver.NodeStageVolume(context.Background(), req); return err },
		"unstage": func() error {
			_, err := env.driver.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging})
			return err
		},
		"publish": func() error {
			_, err := env.driver.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: filepath.Join(env.dir, "t"), VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			return err
		},
		"unpublish": func() error {
			_, err := env.driver.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: filepath.Join(env.dir, "t")})
			return err
		},
	} {
		if code := status.Code(statusOf(call())); code != codes.Aborted {
			t.Errorf("%s during an in-flight stage: %v, want Aborted", name, code)
		}
	}
	// Another volume proceeds: its unstage finds no record and returns OK.
	if _, err := env.driver.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: filepath.Join(env.dir, "s2")}); err != nil {
		t.Errorf("other volume blocked: %v", err)
	}
	close(env.attacher.release)
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("first stage: %v", firstErr)
	}
	// The lock is released: the same stage is now idempotent.
	env.attacher.attachIn = nil
	if _, err := env.driver.NodeStageVolume(context.Background(), req); err != nil {
		t.Errorf("stage after release: %v", err)
	}
}

// TestSecretsNeverLogged stages with node-stage secrets through the gRPC
// server at -v=5 and asserts no secret value reaches the log, in success
// and in validation failure.
func TestSecretsNeverLogged(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-v=5", "-logtostderr=false", "-alsologtostderr=false"}); err != nil {
		t.Fatal(err)
	}
	klog.SetOutput(&lockedWriter{w: &buf, mu: &mu})
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		fs.Set("v", "0")
		fs.Set("logtostderr", "true")
	})

	env := newFakeEnv(t)
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	conn := serveOnSocket(t, env.driver)
	node := csi.NewNodeClient(conn)
	staging := mkdir(t, env.dir, "staging")

	secret := dhchapKey("secret-that-must-never-be-logged")
	ctrlSecret := dhchapKey("ctrl-secret-never-logged-either!")
	req := &csi.NodeStageVolumeRequest{
		VolumeId:          "vol-secret",
		StagingTargetPath: staging,
		VolumeCapability:  blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		VolumeContext:     nvmeContext(),
		Secrets:           map[string]string{"dhchapSecret": secret, "dhchapCtrlSecret": ctrlSecret},
	}
	if _, err := node.NodeStageVolume(context.Background(), req); err != nil {
		t.Fatalf("stage with secrets: %v", err)
	}
	env.attacher.mu.Lock()
	got := env.attacher.secrets
	env.attacher.mu.Unlock()
	if len(got) != 1 || got[0].DHCHAPSecret != secret {
		t.Fatalf("attacher did not receive the secret: %v", got)
	}
	// A malformed secret fails validation; its error must not carry it.
	bad := "not-a-dhchap-key-but-still-secret-9f8e7d"
	req.VolumeId = "vol-secret-2"
	req.Secrets = map[string]string{"dhchapSecret": bad}
	_, err := node.NodeStageVolume(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed secret: %v, want InvalidArgument", err)
	}
	if strings.Contains(err.Error(), bad) {
		t.Errorf("error returned to the caller carries the secret: %v", err)
	}
	klog.Flush()
	time.Sleep(10 * time.Millisecond)
	mu.Lock()
	logs := buf.String()
	mu.Unlock()
	if !strings.Contains(logs, "NodeStageVolume") || !strings.Contains(logs, "vol-secret") {
		t.Fatalf("expected request logs at -v=5, got:\n%s", logs)
	}
	for _, s := range []string{secret, ctrlSecret, bad, strings.Split(secret, ":")[2]} {
		if strings.Contains(logs, s) {
			t.Errorf("secret %q found in logs:\n%s", s, logs)
		}
	}
}

// dhchapKey builds a well-formed DH-HMAC-CHAP secret from 32 key bytes:
// DHHC-1:00:base64(key || crc32(key)):
func dhchapKey(key32 string) string {
	key := []byte(key32)
	raw := binary.LittleEndian.AppendUint32(key, crc32.ChecksumIEEE(key))
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(raw) + ":"
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func depsFor(t *testing.T, a driver.Attacher) driver.Deps {
	t.Helper()
	env := newFakeEnv(t)
	return withTable(driver.Deps{
		SysFS:     sysfs.New(env.dir),
		Intents:   ownerOf(t, env.store),
		Mounter:   env.driver2Mounter(),
		Exec:      execNew(),
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: a, volume.TransportISCSI: a},
	}, env.mounter)
}

func newDriverWith(t *testing.T, fs sysfs.FS, store *volume.Store, a driver.Attacher) *driver.Driver {
	t.Helper()
	deps := depsFor(t, a)
	deps.SysFS, deps.Intents = fs, ownerOf(t, store)
	d, err := driver.New(testConfig("ext4"), deps)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
