package driver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/internal/looptest"
	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The mount-layer matrix: a volume staged at S and published at T under
// the kubelet root; a foreign tmpfs goes at one position; one RPC runs
// through the gRPC server. Each case asserts the answer, which layers are
// left mounted, what was removed, and that no secret is in the answer or
// in any log line (text or JSON, every verbosity). On the real kernel when
// the test runs as root (tmpfs, loop devices, bind mounts, a mount slid
// under another with move_mount(2)), and on the in-memory table always.

// position is where the foreign layer goes.
type position string

const (
	onTarget     position = "on top of the publication"
	underTarget  position = "under the publication"
	insideTarget position = "inside the publication"
	onStaging    position = "on top of the staging mount"
	underStaging position = "under the staging mount"
	beside       position = "beside the publication"
	overRoot     position = "over the kubelet root"
)

var positions = []position{onTarget, underTarget, insideTarget, onStaging, underStaging, beside, overRoot}

// rpc is the call a case makes.
type rpc string

const (
	publishAgain rpc = "NodePublish again"
	publishNew   rpc = "NodePublish at a new target"
	unpublishT   rpc = "NodeUnpublish"
	stageAgain   rpc = "NodeStage again"
	unstageS     rpc = "NodeUnstage"
	expandT      rpc = "NodeExpandVolume"
	statsT       rpc = "NodeGetVolumeStats"
)

var rpcs = []rpc{publishAgain, publishNew, unpublishT, stageAgain, unstageS, expandT, statsT}

// refused says which cases answer FailedPrecondition: a foreign layer at,
// on, under, inside or over a path the call acts on. NodeUnstage runs on
// a volume that is not published (kubelet unpublishes first): a foreign
// layer at the former target path is then nothing of the volume's.
func refused(p position, r rpc) bool {
	switch p {
	case onTarget, underTarget, insideTarget:
		return r == publishAgain || r == unpublishT || r == expandT || r == statsT
	case onStaging, underStaging:
		return r == publishNew || r == stageAgain || r == unstageS || r == expandT
	case overRoot:
		return true
	}
	return false
}

// world is where a case runs: the real kernel, or the in-memory table.
type world struct {
	name string
	// build returns a driver confined to root that logs to logger, and a
	// volume to stage (its ID and context).
	build func(t *testing.T, dir, root string, logger logr.Logger) (*driver.Driver, string, map[string]string)
	// foreign mounts a tmpfs named source at path (slid under the stack
	// with beneath).
	foreign func(t *testing.T, path, source string, beneath bool)
	// table reads the mount table.
	table func(t *testing.T) *mounts.Table
	// cleanup unmounts everything at paths (the test's end).
	cleanup func(paths ...string)
}

// matrixSecret is the node-stage secret every case stages with: no answer
// and no log line may hold it.
var matrixSecret = dhchapKey("matrix-key-that-is-never-logged!")

func realWorld() world {
	return world{
		name: "real",
		build: func(t *testing.T, dir, root string, logger logr.Logger) (*driver.Driver, string, map[string]string) {
			requireMounts(t)
			store, err := volume.NewStore(filepath.Join(dir, "state"))
			if err != nil {
				t.Fatal(err)
			}
			backing := mkdir(t, dir, "backing")
			ex := utilexec.New()
			att := looptest.NewAttacher()
			cfg := testConfig("ext4")
			cfg.KubeletRoot = root
			d, err := driver.New(cfg, driver.Deps{
				SysFS: sysfs.New(t.TempDir()), Intents: ownerOf(t, store), Exec: ex,
				Mounter:   mount.NewSafeFormatAndMount(mount.New(""), ex),
				Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: att, volume.TransportISCSI: driver.NotBuilt(volume.TransportISCSI)},
				Logger:    logger,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctrl := looptest.NewController(backing, att)
			resp, err := ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "matrix", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
			if err != nil {
				t.Fatal(err)
			}
			return d, resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()
		},
		foreign: func(t *testing.T, path, source string, beneath bool) {
			infos, err := mounts.ReadInfo(mounts.SelfMountInfo)
			if err != nil {
				t.Fatal(err)
			}
			// Under nothing is at: a mount slides only under a mount.
			if beneath && len(mounts.NewTable(infos).Stack(path)) > 0 {
				t.Cleanup(func() { mountstest.UnmountAll(path) })
				if err := mountstest.TmpfsBeneath(path, source); err != nil {
					testneed.Skip(t, "move_mount MOVE_MOUNT_BENEATH (Linux 6.5): %v", err)
				}
				return
			}
			mountstest.Tmpfs(t, path, source)
		},
		table: func(t *testing.T) *mounts.Table {
			infos, err := mounts.ReadInfo(mounts.SelfMountInfo)
			if err != nil {
				t.Fatal(err)
			}
			return mounts.NewTable(infos)
		},
		cleanup: func(paths ...string) {
			for _, p := range paths {
				mountstest.UnmountAll(p)
			}
		},
	}
}

func fakeWorld() world {
	var tb sync.Map // *testing.T → *mountstest.Table
	return world{
		name: "table",
		build: func(t *testing.T, dir, root string, logger logr.Logger) (*driver.Driver, string, map[string]string) {
			m := mountstest.New()
			tb.Store(t, m)
			store, err := volume.NewStore(filepath.Join(dir, "state"))
			if err != nil {
				t.Fatal(err)
			}
			fa := &fakeAttacher{device: filepath.Join(dir, "dev-fake")}
			if err := os.WriteFile(fa.device, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig("ext4")
			cfg.KubeletRoot = root
			tools := resizeTools()
			d, err := driver.New(cfg, withTable(driver.Deps{
				SysFS: sysfs.New(dir), Intents: ownerOf(t, store), Exec: tools,
				Mounter:   &mount.SafeFormatAndMount{Interface: m, Exec: tools},
				Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: fa, volume.TransportISCSI: fa},
				Logger:    logger,
			}, m))
			if err != nil {
				t.Fatal(err)
			}
			return d, "vol-matrix", nvmeContext()
		},
		foreign: func(t *testing.T, path, source string, beneath bool) {
			m, _ := tb.Load(t)
			m.(*mountstest.Table).Foreign(path, "tmpfs", source, beneath)
		},
		table: func(t *testing.T) *mounts.Table {
			m, _ := tb.Load(t)
			return m.(*mountstest.Table).Snapshot()
		},
		cleanup: func(...string) {},
	}
}

// resizeTools answers the filesystem tools of a stage and a grow on the
// in-memory table: the device holds ext4 of its full size, clean.
func resizeTools() *iscsitest.Exec {
	return &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		switch argv[0] {
		case "blkid":
			return iscsitest.Result{Out: "TYPE=ext4\n"}
		case "blockdev":
			if slices.Contains(argv, "--getro") {
				return iscsitest.Result{Out: "0\n"}
			}
			return iscsitest.Result{Out: "1048576\n"}
		case "dumpe2fs":
			return iscsitest.Result{Out: "Block count:              256\nBlock size:               4096\n"}
		}
		return iscsitest.Result{}
	}}
}

// TestLayers_Matrix is the matrix on the in-memory table (always) and on
// the real kernel (as root).
func TestLayers_Matrix(t *testing.T) {
	for _, w := range []world{fakeWorld(), realWorld()} {
		t.Run(w.name, func(t *testing.T) {
			if w.name == "real" {
				requireMounts(t)
			}
			i := 0
			for _, p := range positions {
				for _, r := range rpcs {
					format := []string{"text", "json"}[i%2]
					i++
					t.Run(fmt.Sprintf("%s/%s", p, r), func(t *testing.T) {
						if w.name != "real" {
							// Every case has its own table and log sink;
							// the real kernel's run one at a time, to keep
							// loop devices and mkfs off each other.
							t.Parallel()
						}
						runMatrixCase(t, w, p, r, format)
					})
				}
			}
		})
	}
}

// layerSet is the IDs of layers in a table.
func layerSet(tb *mounts.Table) map[int]mounts.Layer {
	out := map[int]mounts.Layer{}
	for _, l := range tb.Layers() {
		out[l.ID] = l
	}
	return out
}

func runMatrixCase(t *testing.T, w world, p position, r rpc, format string) {
	ctx := context.Background()
	dir := t.TempDir()
	root := mkdir(t, dir, "kubelet")
	staging := mkdir(t, root, "plugins", "kubernetes.io", "csi", "pv", "globalmount")
	target := filepath.Join(mkdir(t, root, "pods", "p1", "volumes"), "mount")
	target2 := filepath.Join(mkdir(t, root, "pods", "p2", "volumes"), "mount")
	sibling := mkdir(t, root, "pods", "p1", "volumes", "other")
	logger, buf := newLogs(t, format)
	d, volID, vc := w.build(t, dir, root, logger)
	node := csi.NewNodeClient(serveOnSocket(t, d))
	capM := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)
	secrets := map[string]string{"dhchapSecret": matrixSecret}
	stageReq := &csi.NodeStageVolumeRequest{VolumeId: volID, StagingTargetPath: staging, VolumeCapability: capM, VolumeContext: vc, Secrets: secrets}
	pubReq := func(tp string) *csi.NodePublishVolumeRequest {
		return &csi.NodePublishVolumeRequest{VolumeId: volID, StagingTargetPath: staging, TargetPath: tp, VolumeCapability: capM, VolumeContext: vc}
	}
	// The end: every mount of the case lazily gone, then the volume
	// unstaged (its loop device detached).
	t.Cleanup(func() {
		w.cleanup(filepath.Join(target, "sub"), target, target2, sibling, staging, root)
		_, _ = node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging})
	})
	ok(t)(node.NodeStageVolume(ctx, stageReq))
	if r != unstageS {
		ok(t)(node.NodePublishVolume(ctx, pubReq(target)))
	} else if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	before := layerSet(w.table(t))

	source := "foreign-" + strings.ReplaceAll(string(p), " ", "-")
	switch p {
	case onTarget, underTarget:
		w.foreign(t, target, source, p == underTarget)
	case insideTarget:
		if err := os.MkdirAll(filepath.Join(target, "sub"), 0o750); err != nil {
			t.Fatal(err)
		}
		w.foreign(t, filepath.Join(target, "sub"), source, false)
	case onStaging, underStaging:
		w.foreign(t, staging, source, p == underStaging)
	case beside:
		w.foreign(t, sibling, source, false)
	case overRoot:
		w.foreign(t, root, source, false)
	}
	foreignOf := func(tb *mounts.Table) (mounts.Layer, bool) {
		i := slices.IndexFunc(tb.Layers(), func(l mounts.Layer) bool { return l.Source == source })
		if i < 0 {
			return mounts.Layer{}, false
		}
		return tb.Layers()[i], true
	}
	fl, ok := foreignOf(w.table(t))
	if !ok {
		t.Fatalf("the foreign layer is not in the table")
	}

	var err error
	switch r {
	case publishAgain:
		_, err = node.NodePublishVolume(ctx, pubReq(target))
	case publishNew:
		_, err = node.NodePublishVolume(ctx, pubReq(target2))
	case unpublishT:
		_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: target})
	case stageAgain:
		_, err = node.NodeStageVolume(ctx, stageReq)
	case unstageS:
		_, err = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging})
	case expandT:
		_, err = node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: volID, VolumePath: target})
	case statsT:
		_, err = node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: volID, VolumePath: target})
	}

	// The answer.
	st := status.Convert(err)
	if refused(p, r) {
		if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), source) || !strings.Contains(st.Message(), "tmpfs") {
			t.Errorf("answer %v: want FailedPrecondition naming the foreign layer (tmpfs %s)", err, source)
		}
	} else if err != nil {
		t.Errorf("answer %v: want OK", err)
	}
	noLeak(t, "the answer", st.Message(), matrixSecret)

	// What is left mounted.
	after := w.table(t)
	if l, ok := foreignOf(after); !ok || l.ID != fl.ID {
		t.Errorf("the foreign layer %s was unmounted", fl)
	}
	// Only the case's own directory counts: on the real kernel, tests of
	// other packages mount and unmount on the same host meanwhile.
	mine, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	afterSet := layerSet(after)
	var gone []string
	for id, l := range before {
		if _, ok := afterSet[id]; !ok && strings.HasPrefix(l.MountPoint, mine+"/") {
			gone = append(gone, l.MountPoint)
		}
	}
	wantGone := []string{}
	if !refused(p, r) {
		switch r {
		case unpublishT:
			wantGone = []string{target}
		case unstageS:
			wantGone = []string{staging}
		}
	}
	if !slices.Equal(gone, wantGone) {
		t.Errorf("unmounted %v, want %v", gone, wantGone)
	}
	if !refused(p, r) && r == publishNew && len(after.Stack(target2)) != 1 {
		t.Errorf("the new publication is not mounted: %v", after.Stack(target2))
	}

	// What was removed: only the target NodePublish created, on a
	// successful unpublish.
	if p != overRoot {
		_, terr := os.Lstat(target)
		removed := os.IsNotExist(terr)
		if want := !refused(p, r) && r == unpublishT; removed != want {
			t.Errorf("target path removed = %t, want %t", removed, want)
		}
		if _, err := os.Lstat(staging); err != nil {
			t.Errorf("the staging path is gone: %v", err)
		}
	}

	// No secret in any log line.
	logText := buf.String()
	if !strings.Contains(logText, "RPC") {
		t.Fatalf("no log line at all: the log capture is broken")
	}
	noLeak(t, "the "+format+" log", logText, matrixSecret)
}
