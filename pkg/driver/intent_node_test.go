package driver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/nvme"
	nvmeattach "github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

const (
	sharedNQN = "nqn.2014-08.io.pathmend.test:shared"
	testIQN   = "iqn.2024-01.io.example:t"
)

var testHost = fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"}

// hookMounter is a fake mount table whose mounts can be made to block or
// fail, to stop a NodeStage between its attach and its record.
type hookMounter struct {
	*mountstest.Table
	mu      sync.Mutex
	onMount func(source, target string) error
}

func (m *hookMounter) hook(source, target string) error {
	m.mu.Lock()
	f := m.onMount
	m.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(source, target)
}

func (m *hookMounter) Mount(source, target, fstype string, options []string) error {
	if err := m.hook(source, target); err != nil {
		return err
	}
	return m.Table.Mount(source, target, fstype, options)
}

func (m *hookMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	if err := m.hook(source, target); err != nil {
		return err
	}
	return m.Table.MountSensitive(source, target, fstype, options, sensitive)
}

func (m *hookMounter) set(f func(source, target string) error) {
	m.mu.Lock()
	m.onMount = f
	m.mu.Unlock()
}

// fsTools answers the filesystem tools SafeFormatAndMount runs: every
// device already holds ext4, fsck finds it clean.
func fsTools() *iscsitest.Exec {
	return &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		if argv[0] == "blkid" {
			return iscsitest.Result{Out: "TYPE=ext4\n"}
		}
		return iscsitest.Result{}
	}}
}

// node is one node's kernel, disk and plugin: the fake NVMe kernel, the
// fake iSCSI host and the state directory survive restart, the plugin
// process (owner, attachers, driver, in-memory locks) does not.
type node struct {
	t        *testing.T
	clk      *clocktesting.FakeClock
	kernel   *nvmetest.Kernel
	host     *iscsitest.Host
	stateDir string
	staging  string
	mnt      *hookMounter
	runner   func(func())
	// logger, when set, is the driver's (Deps.Logger); connector, when
	// set, connects NVMe instead of the kernel itself.
	logger    logr.Logger
	connector nvme.Connector

	store    *volume.Store
	owner    *intent.Owner
	policy   *heal.Policy
	nvmeAtt  *nvmeattach.Attacher
	iscsiAtt *attach.Attacher
	drv      *driver.Driver
}

func newNode(t *testing.T) *node {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	k := nvmetest.NewKernel(t.TempDir(), clk)
	k.AddTarget(nvmetest.SharedTarget(sharedNQN))
	host, err := iscsitest.NewHost(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	host.LUNs = []int{0, 1}
	n := &node{t: t, clk: clk, kernel: k, host: host, stateDir: filepath.Join(t.TempDir(), "state"), staging: t.TempDir(),
		mnt: &hookMounter{Table: mountstest.New()}, runner: func(f func()) { f() }}
	n.start()
	return n
}

// start builds the plugin process over the node.
func (n *node) start() {
	t := n.t
	t.Helper()
	var err error
	if n.store, err = volume.NewStore(n.stateDir); err != nil {
		t.Fatal(err)
	}
	if n.owner, err = intent.New(intent.Config{}, intent.Deps{Store: n.store, Clock: n.clk, Runner: n.runner}); err != nil {
		t.Fatal(err)
	}
	if n.policy, err = heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: n.clk.Now}); err != nil {
		t.Fatal(err)
	}
	n.nvmeAtt, err = nvmeattach.NewAttacher(nvmeattach.AttacherConfig{
		SysFS: n.kernel.FS(), DevRoot: "/dev", Connector: n.nvmeConnector(), Host: testHost, Mender: n.mender(),
		AttachWait: 300 * time.Millisecond, Poll: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: n.host.Exec, Sys: sysfs.New(n.host.Sys), Writer: n.host, LoginTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.iscsiAtt, err = attach.NewAttacher(attach.AttacherConfig{
		Sys: sysfs.New(n.host.Sys), Writer: n.host, DevRoot: n.host.Dev, Initiator: in,
		NodeLoginTimeout: time.Second, NodeLoginRetries: 2,
		DeviceTimeout: time.Second, MultipathWait: 100 * time.Millisecond, PollInterval: 5 * time.Millisecond,
		VerifyNode: func(path, _ string) error { _, err := os.Stat(path); return err },
	})
	if err != nil {
		t.Fatal(err)
	}
	ex := fsTools()
	n.mnt.DevOf = mountstest.SysfsDevices(n.kernel.FS(), sysfs.New(n.host.Sys))
	n.drv, err = driver.New(testConfig("ext4"), withTable(driver.Deps{
		SysFS: n.kernel.FS(), Intents: n.owner, Exec: ex,
		Mounter: &mount.SafeFormatAndMount{Interface: n.mnt, Exec: ex},
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: n.nvmeAtt,
			volume.TransportISCSI:   n.iscsiAtt,
		},
		Clock:  n.clk,
		Logger: n.logger,
	}, n.mnt.Table))
	if err != nil {
		t.Fatal(err)
	}
}

func (n *node) nvmeConnector() nvme.Connector {
	if n.connector != nil {
		return n.connector
	}
	return n.kernel
}

// restart is a kill -9 and a start: what was in memory is gone, the
// kernel, the host and the state directory are not.
func (n *node) restart() { n.start() }

func (n *node) stagingPath(volumeID string) string {
	p := filepath.Join(n.staging, volumeID)
	if err := os.MkdirAll(p, 0o750); err != nil {
		n.t.Fatal(err)
	}
	return p
}

// stageRequest stages volumeID with context vc, for block or mount
// (ext4) access.
func (n *node) stageRequest(volumeID string, vc map[string]string, block bool) *csi.NodeStageVolumeRequest {
	c := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if block {
		c = blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	}
	return &csi.NodeStageVolumeRequest{VolumeId: volumeID, StagingTargetPath: n.stagingPath(volumeID), VolumeCapability: c, VolumeContext: vc}
}

func (n *node) stage(volumeID string, vc map[string]string, block bool) error {
	_, err := n.drv.NodeStageVolume(context.Background(), n.stageRequest(volumeID, vc, block))
	return statusOf(err)
}

func (n *node) unstage(volumeID string) error {
	_, err := n.drv.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: volumeID, StagingTargetPath: n.stagingPath(volumeID)})
	return statusOf(err)
}

// livePaths is how many of the volume's two paths are live.
func (n *node) livePaths(nsid uint32) int {
	n.t.Helper()
	h, err := nvme.Read(n.kernel.FS())
	if err != nil {
		n.t.Fatal(err)
	}
	c, _, err := volume.Parse(nvmeVolumeContext(nsid), nil)
	if err != nil {
		n.t.Fatal(err)
	}
	e, _ := nvme.ExpectationFromRecord(volume.Record{VolumeID: "x", Context: c})
	return nvme.ReportPaths(h, e).Live
}

// deletes lists the controllers the kernel was asked to delete.
func (n *node) deletes() []string {
	var out []string
	for _, c := range n.kernel.Calls() {
		if strings.HasPrefix(c, "delete ") {
			out = append(out, c)
		}
	}
	return out
}

// nvmeVolumeContext is namespace nsid of the shared subsystem over both
// ports.
func nvmeVolumeContext(nsid uint32) map[string]string {
	return map[string]string{
		"transport": "nvme-tcp", "nqn": sharedNQN,
		"endpoints": "127.0.0.1:4420,127.0.0.2:4420", "optimizedEndpoints": "127.0.0.1:4420",
		"nsid": fmt.Sprint(nsid),
	}
}

// iscsiVolumeContext is LUN lun of the test target over both portals.
func iscsiVolumeContext(lun int) map[string]string {
	return map[string]string{"transport": "iscsi", "iqn": testIQN, "portals": "127.0.0.1,127.0.0.2", "lun": fmt.Sprint(lun)}
}

// mender is the NVMe transport whose repair step the attacher runs; its
// waits run on the real clock, as the attacher's do.
func (n *node) mender() *nvmeheal.Transport {
	tr, err := nvmeheal.New(nvmeheal.Config{}, nvmeheal.Deps{SysFS: n.kernel.FS(), Policy: n.policy, Connector: n.kernel,
		Prober: nvmeheal.TCPProber{Timeout: time.Millisecond}})
	if err != nil {
		n.t.Fatal(err)
	}
	return tr
}
