package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/build"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// The black-box test: the binary `go build` makes, started as
// `pathmend serve` on a temp socket with temp state, sys and dev roots,
// and the hostile or careless callers of the issue that bounded the CSI
// surface thrown at it over that socket.

// buildPathmend builds the pathmend binary into dir.
func buildPathmend(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(build.Default.GOROOT, "bin", "go")
	}
	bin := filepath.Join(dir, "pathmend")
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/pathmend/pathmend/cmd/pathmend").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// lockedBuffer is what a running process writes and the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// served is a running `pathmend serve`.
type served struct {
	cmd     *exec.Cmd
	log     *lockedBuffer
	dir     string
	kubelet string // --kubelet-root
	conn    *grpc.ClientConn
	metrics string // host:port of /metrics and /healthz
}

// serveBuilt starts bin as `pathmend serve` with everything in dir, the
// kubelet root at dir/kubelet, metrics on a loopback port, -v=10 and a
// topology segment, and waits for its socket and its metrics listener.
func serveBuilt(t *testing.T, bin, dir string) *served {
	t.Helper()
	s := &served{dir: dir, kubelet: filepath.Join(dir, "kubelet"), log: &lockedBuffer{}}
	for _, d := range []string{"sys", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "csi.sock")
	s.cmd = exec.Command(bin, "serve", "--endpoint=unix://"+sock, "--node-id=blackbox",
		"--sys-root="+filepath.Join(dir, "sys"), "--dev-root="+dir, "--state-dir="+filepath.Join(dir, "state"),
		"--hostnqn-file="+filepath.Join(dir, "hostnqn"), "--hostid-file="+filepath.Join(dir, "hostid"),
		"--heal=observe", "--kubelet-root="+s.kubelet, "--metrics-address=127.0.0.1:0",
		"--topology-key=topology.pathmend.io/zone", "--topology-value=z1", "-v=10")
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-exited
	})
	addrRE := regexp.MustCompile(`"Serving metrics and health" address="([^"]+)"`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			if m := addrRE.FindStringSubmatch(s.log.String()); m != nil {
				s.metrics = m[1]
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("pathmend exited at start:\n%s", s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pathmend did not come up:\n%s", s.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn = conn
	return s
}

// cpuTime is the user and system CPU time the process has used, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 1/100 s).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// requireRoot skips a case that needs root, except under CI=true, where a
// missing privilege is a failure.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("needs root (mounts); CI runs as root")
	}
	t.Skip("needs root for mounts")
}

// wantInvalid checks err is InvalidArgument whose message names want and
// stays short, however big the offending value.
func wantInvalid(t *testing.T, err error, want string) {
	t.Helper()
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, want) {
		t.Errorf("message %q does not name %q", msg, want)
	}
	if len(msg) > 512 {
		t.Errorf("message is %d bytes long: %.200s…", len(msg), msg)
	}
}

func TestBlackBox_HostileCallers(t *testing.T) {
	dir := t.TempDir()
	s := serveBuilt(t, buildPathmend(t, dir), filepath.Join(dir, "run"))
	node, identity := csi.NewNodeClient(s.conn), csi.NewIdentityClient(s.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	staging := filepath.Join(s.kubelet, "plugins", "kubernetes.io", "csi", "csi.pathmend.io", "vol", "globalmount")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	nvme := func() map[string]string {
		return map[string]string{"transport": "nvme-tcp", "nqn": "nqn.2014-08.io.pathmend.test:vol1", "endpoints": "127.0.0.1:4420", "nsid": "1"}
	}
	stage := func(id string, vc, pc, secrets map[string]string) error {
		_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: staging, VolumeContext: vc, PublishContext: pc, Secrets: secrets,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
		})
		return err
	}
	records := filepath.Join(s.dir, "state", "volumes")

	t.Run("a 1.1 MiB volume_id", func(t *testing.T) {
		wantInvalid(t, stage(strings.Repeat("v", 1100<<10), nvme(), nil, nil), "volume_id is 1126400 bytes; the CSI limit for a string is 128 bytes")
		if entries, _ := os.ReadDir(records); len(entries) != 0 {
			t.Errorf("%d records written", len(entries))
		}
		// Other volumes are not wedged.
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-other", StagingTargetPath: staging}); err != nil {
			t.Errorf("unstage of another volume: %v", err)
		}
	})
	t.Run("160,000 endpoints", func(t *testing.T) {
		vc := nvme()
		items := make([]string, 160000)
		for i := range items {
			items[i] = fmt.Sprintf("10.%d.%d.%d:4420", i>>16&0xff, i>>8&0xff, i&0xff)
		}
		vc["endpoints"] = strings.Join(items, ",")
		start := time.Now()
		wantInvalid(t, stage("vol-many", vc, nil, nil), "volume_context is")
		t.Logf("160,000 endpoints (%d bytes) refused in %v", len(vc["endpoints"]), time.Since(start))
	})
	t.Run("a 1 MiB key", func(t *testing.T) {
		vc := nvme()
		vc[strings.Repeat("k", 1<<20)] = "x"
		wantInvalid(t, stage("vol-key", vc, nil, nil), "volume_context is")
		// Within the limits, an unknown key is named by a short prefix.
		vc = nvme()
		vc[strings.Repeat("k", 3000)] = "x"
		wantInvalid(t, stage("vol-key", vc, nil, nil), `volume context key "kkkk`)
	})
	t.Run("an NQN with '='", func(t *testing.T) {
		vc := nvme()
		vc["nqn"] = "nqn.2014-08.io.pathmend.test:a=b"
		wantInvalid(t, stage("vol-eq", vc, nil, nil), `volume context key "nqn"`)
	})
	t.Run("credentials in every map at -v=10", func(t *testing.T) {
		creds := map[string]string{
			"chapUsername": "bb-user-in-context-1", "chapPassword": "bb-password-in-context-2",
			"chapUsernameIn": "bb-user-in-context-3", "chapPasswordIn": "bb-password-in-context-4",
			"dhchapSecret": "DHHC-1:00:YmxhY2tib3gtaG9zdC1rZXktbmV2ZXItbG9nZ2VkLTAxMjM0NTY3:", "dhchapCtrlSecret": "DHHC-1:00:YmxhY2tib3gtY3RybC1rZXktbmV2ZXItbG9nZ2VkLTAxMjM0NTY3:",
		}
		withCreds := func(m map[string]string) map[string]string {
			for k, v := range creds {
				m[k] = v
			}
			return m
		}
		if err := stage("vol-cred-1", withCreds(nvme()), nil, nil); status.Code(err) != codes.InvalidArgument {
			t.Errorf("credentials in the volume context: %v", err)
		}
		if err := stage("vol-cred-2", nvme(), withCreds(map[string]string{}), nil); status.Code(err) != codes.InvalidArgument {
			t.Errorf("credentials in the publish context: %v", err)
		}
		_ = stage("vol-cred-3", nvme(), nil, withCreds(map[string]string{}))
		log := s.log.String()
		if !strings.Contains(log, "vol-cred-2") || !strings.Contains(log, "RPC request") {
			t.Fatalf("no request dumps at -v=10")
		}
		for k, v := range creds {
			if strings.Contains(log, v) {
				t.Errorf("the value of %s is in the log", k)
			}
		}
	})
	t.Run("topology is advertised", func(t *testing.T) {
		caps, err := identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range caps.GetCapabilities() {
			found = found || c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS
		}
		info, err := node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		if err != nil || info.GetAccessibleTopology().GetSegments()["topology.pathmend.io/zone"] != "z1" || !found {
			t.Errorf("NodeGetInfo = %v, %v; VOLUME_ACCESSIBILITY_CONSTRAINTS advertised: %t", info, err, found)
		}
	})
	t.Run("a foreign tmpfs is not unmounted", func(t *testing.T) {
		requireRoot(t)
		inside := filepath.Join(s.kubelet, "pods", "uid", "volumes", "kubernetes.io~csi", "pv", "mount")
		outside := filepath.Join(s.dir, "outside")
		for _, p := range []string{inside, outside} {
			if err := os.MkdirAll(p, 0o750); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", p).CombinedOutput(); err != nil {
				t.Fatalf("mount tmpfs: %v: %s", err, out)
			}
			t.Cleanup(func() { _ = exec.Command("umount", p).Run() })
			if err := os.WriteFile(filepath.Join(p, "data"), []byte("foreign"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: inside})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("unpublish of a foreign mount: %v, want FailedPrecondition", err)
		}
		_, err = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: inside})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("unstage of a foreign mount: %v, want FailedPrecondition", err)
		}
		_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: outside})
		wantInvalid(t, err, "--kubelet-root")
		for _, p := range []string{inside, outside} {
			if b, err := os.ReadFile(filepath.Join(p, "data")); err != nil || string(b) != "foreign" {
				t.Errorf("%s lost its mount or content: %q, %v", p, b, err)
			}
		}
	})
	t.Run("a /healthz flood", func(t *testing.T) {
		before, err := os.Stat(records)
		if err != nil {
			t.Fatal(err)
		}
		probesBefore := strings.Count(s.log.String(), `method="/csi.v1.Identity/Probe"`)
		cpuBefore := cpuTime(t, s.cmd.Process.Pid)
		const requests, workers = 5000, 16
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		start := time.Now()
		var wg sync.WaitGroup
		var failed sync.Map
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range requests / workers {
					resp, err := client.Get("http://" + s.metrics + "/healthz")
					if err != nil {
						failed.Store(w, err)
						return
					}
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		failed.Range(func(_, v any) bool { t.Errorf("request: %v", v); return false })
		cpu := cpuTime(t, s.cmd.Process.Pid) - cpuBefore
		// One Probe per HealthTTL at most: the probe lines pathmend logs
		// at -v=4 and above count the Probe RPCs /healthz made.
		probes := strings.Count(s.log.String(), `"RPC" method="/csi.v1.Identity/Probe"`) - probesBefore
		if maxProbes := int(elapsed/time.Second) + 2; probes > maxProbes {
			t.Errorf("%d requests in %v ran %d Probe RPCs, want at most %d", requests, elapsed, probes, maxProbes)
		}
		after, err := os.Stat(records)
		if err != nil {
			t.Fatal(err)
		}
		if !after.ModTime().Equal(before.ModTime()) {
			t.Error("/healthz changed the records directory: a probe created a file")
		}
		t.Logf("/healthz flood: %d requests in %v, %d Probe RPCs, plugin CPU %v", requests, elapsed.Round(time.Millisecond), probes, cpu)
	})
	t.Run("still serving", func(t *testing.T) {
		probe, err := identity.Probe(ctx, &csi.ProbeRequest{})
		if err != nil || !probe.GetReady().GetValue() {
			t.Errorf("Probe after the hostile calls = %v, %v", probe, err)
		}
		if entries, err := os.ReadDir(records); err != nil || len(entries) != 0 {
			t.Errorf("records after the hostile calls: %d, %v", len(entries), errors.Join(err))
		}
		if strings.Contains(s.log.String(), strings.Repeat("v", 300)) || strings.Contains(s.log.String(), strings.Repeat("k", 300)) {
			t.Error("an over-limit value was logged whole")
		}
	})
}
