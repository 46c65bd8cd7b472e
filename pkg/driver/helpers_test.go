package driver_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/internal/looptest"
	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// requireMounts skips a test that needs root, loop devices and mkfs.
func requireMounts(t *testing.T) {
	t.Helper()
	testneed.Root(t, "loop devices and mounts")
	testneed.Tools(t, map[string]string{"losetup": "mount", "mkfs.ext4": "e2fsprogs", "mkfs.xfs": "xfsprogs", "mount": "mount", "umount": "mount", "blkid": "util-linux"},
		"losetup", "mkfs.ext4", "mkfs.xfs", "mount", "umount", "blkid")
}

// testEnv is a real driver on real mounts with the loop attacher.
type testEnv struct {
	dir        string
	driver     *driver.Driver
	attacher   *looptest.Attacher
	store      *volume.Store
	mounter    *mount.SafeFormatAndMount
	backingDir string
	ctrl       *looptest.Controller
}

func testConfig(defaultFS string) driver.Config {
	return driver.Config{
		DriverName:    "csi.pathmend.io",
		Version:       "v0.0.0-test",
		NodeID:        "node-1",
		HealMode:      heal.ModeObserve,
		DefaultFSType: defaultFS,
	}
}

// ownerOf is an intent owner over store.
func ownerOf(t *testing.T, store *volume.Store) *intent.Owner {
	t.Helper()
	o, err := intent.New(intent.Config{}, intent.Deps{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func newTestEnv(t *testing.T, dir, defaultFS string) *testEnv {
	t.Helper()
	return newTestEnvOn(t, dir, defaultFS, sysfs.New(t.TempDir()))
}

// newTestEnvOn is newTestEnv reading sys: the node's /sys for a test
// that needs the kernel's view of its loop devices and filesystems.
func newTestEnvOn(t *testing.T, dir, defaultFS string, sys sysfs.FS) *testEnv {
	t.Helper()
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join(dir, "backing")
	if err := os.MkdirAll(backing, 0o700); err != nil {
		t.Fatal(err)
	}
	ex := utilexec.New()
	m := mount.NewSafeFormatAndMount(mount.New(""), ex)
	att := looptest.NewAttacher()
	d, err := driver.New(testConfig(defaultFS), driver.Deps{
		SysFS:   sys,
		Intents: ownerOf(t, store),
		Mounter: m,
		Exec:    ex,
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: att,
			volume.TransportISCSI:   driver.NotBuilt(volume.TransportISCSI),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{dir: dir, driver: d, attacher: att, store: store, mounter: m, backingDir: backing}
	env.ctrl = looptest.NewController(backing, att)
	return env
}

// createVolume makes a loop-backed volume of size bytes.
func (e *testEnv) createVolume(t *testing.T, name string, size int64) *csi.Volume {
	t.Helper()
	resp, err := e.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume()
}

func mountCap(fsType string, mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// fakeAttacher records calls and can block Attach until released.
type fakeAttacher struct {
	mu       sync.Mutex
	calls    []string
	secrets  []volume.Secrets
	device   string
	attachIn chan struct{} // closed by Attach when it starts
	release  chan struct{} // Attach waits for it when set
	err      error
	// health, when set, is every volume's condition.
	health func(volume.Record) volume.Condition
}

func (f *fakeAttacher) record(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeAttacher) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeAttacher) Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	a := volume.Attachment{VolumeID: req.VolumeID, Context: req.Context}
	f.record("attach " + req.VolumeID)
	f.mu.Lock()
	f.secrets = append(f.secrets, req.Secrets)
	f.mu.Unlock()
	if f.attachIn != nil {
		close(f.attachIn)
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return a, ctx.Err()
		}
	}
	if f.err != nil {
		return a, f.err
	}
	a.Device = volume.Device{Path: f.device, SizeBytes: 1 << 20}
	return a, nil
}

func (f *fakeAttacher) Undo(_ context.Context, a volume.Attachment, _ volume.CoTenants) error {
	f.record("undo " + a.VolumeID)
	return nil
}

func (f *fakeAttacher) Detach(_ context.Context, rec volume.Record, _ volume.CoTenants) error {
	f.record("detach " + rec.VolumeID)
	return nil
}

func (f *fakeAttacher) Expand(_ context.Context, rec volume.Record) (int64, error) {
	f.record("expand " + rec.VolumeID)
	return 1 << 20, nil
}

func (f *fakeAttacher) Health(_ context.Context, rec volume.Record) volume.Condition {
	if f.health != nil {
		return f.health(rec)
	}
	return volume.Condition{Message: "fake"}
}

// fakeEnv is a driver with a fake attacher and a fake mounter: for tests
// that must prove nothing touches the host.
type fakeEnv struct {
	driver   *driver.Driver
	attacher *fakeAttacher
	mounter  *mountstest.Table
	store    *volume.Store
	dir      string
}

// withTable has d read, unmount and scope its mounts through tb (the
// mounter must be tb, or wrap it).
func withTable(d driver.Deps, tb *mountstest.Table) driver.Deps {
	d.MountInfo, d.UnmountLayer, d.MountNamespace = tb.MountInfo, tb.UnmountLayer, tb.Namespace
	return d
}

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	dir := t.TempDir()
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	fa := &fakeAttacher{device: filepath.Join(dir, "dev-fake")}
	fm := mountstest.New()
	d, err := driver.New(testConfig("ext4"), withTable(driver.Deps{
		SysFS:   sysfs.New(dir),
		Intents: ownerOf(t, store),
		Mounter: mount.NewSafeFormatAndMount(fm, utilexec.New()),
		Exec:    utilexec.New(),
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: fa,
			volume.TransportISCSI:   fa,
		},
		Clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
	}, fm))
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEnv{driver: d, attacher: fa, mounter: fm, store: store, dir: dir}
}

// driver2Mounter returns env's fake mount table wrapped for
// SafeFormatAndMount.
func (e *fakeEnv) driver2Mounter() *mount.SafeFormatAndMount {
	return mount.NewSafeFormatAndMount(e.mounter, utilexec.New())
}

func execNew() utilexec.Interface { return utilexec.New() }

// serveOnSocket serves d (Identity + Node) on a unix socket in a temp dir
// through the production server options and returns a connected client.
func serveOnSocket(t *testing.T, d *driver.Driver) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := d.NewGRPCServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// nvmeContext is a valid nvme-tcp volume context.
func nvmeContext() map[string]string {
	return map[string]string{
		"transport": "nvme-tcp",
		"nqn":       "nqn.2014-08.io.pathmend.test:vol1",
		"endpoints": "127.0.0.1:4420,127.0.0.2:4420",
		"nsid":      "1",
	}
}

// statusOf maps an error the way the gRPC server does.
func statusOf(err error) error { return driver.ToStatus(err) }

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
