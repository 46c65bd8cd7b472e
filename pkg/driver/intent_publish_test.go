package driver_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// crashAfterMount makes its bind mount, then the process dies.
type crashAfterMount struct{ *mountstest.Table }

type crashed struct{}

func (m crashAfterMount) Mount(source, target, fstype string, options []string) error {
	if err := m.Table.Mount(source, target, fstype, options); err != nil {
		return err
	}
	panic(crashed{})
}

// TestIntent_PublishCrashAfterTheBindMount: pathmend dies right after a
// NodePublish's bind mount (found by the node simulation). The restarted
// process answers kubelet's retry OK, and NodeUnpublish releases the
// target: the publication was recorded before the mount. (Recorded after
// it, the mount was nobody's: every retry answered AlreadyExists and
// every unpublish FailedPrecondition, for ever.)
func TestIntent_PublishCrashAfterTheBindMount(t *testing.T) {
	env := newFakeEnv(t)
	staging := stageFake(t, env)
	dying, err := driver.New(testConfig("ext4"), withTable(driver.Deps{
		SysFS: sysfs.New(env.dir), Intents: ownerOf(t, env.store),
		Mounter:   mount.NewSafeFormatAndMount(crashAfterMount{env.mounter}, utilexec.New()),
		Exec:      utilexec.New(),
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: env.attacher, volume.TransportISCSI: env.attacher},
	}, env.mounter))
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(env.dir, "pods", "p1", "volume")
	req := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	func() {
		defer func() {
			if x := recover(); x != (crashed{}) {
				t.Fatalf("the publish did not reach its mount: %v", x)
			}
		}()
		_, _ = dying.NodePublishVolume(context.Background(), req)
	}()
	if mounted, _ := env.mounter.IsMountPoint(target); !mounted {
		t.Fatal("the crashed publish left no mount")
	}

	ctx := context.Background()
	if _, err := env.driver.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("kubelet's retry after the restart: %v", statusOf(err))
	}
	if _, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublish: %v", statusOf(err))
	}
	if mounted, _ := env.mounter.IsMountPoint(target); mounted {
		t.Error("the target is still mounted after NodeUnpublish")
	}
	rec, err := env.store.Get("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) != 0 {
		t.Errorf("publications left in the record: %+v", rec.Publications)
	}
}

// TestIntent_RestageKeepsThePublications: a volume staged and published
// is staged again while it is not in place (kubelet's periodic NodeStage
// after its device went or was renamed; found by the node simulation).
// The record keeps the publication: NodeUnstage still refuses while the
// pod has the volume mounted, and kubelet's retried NodePublish answers
// OK. (Before: the restage rewrote the record without its publications;
// NodeUnstage then detached the volume from under the running pod, and
// every retried NodePublish answered AlreadyExists.)
func TestIntent_RestageKeepsThePublications(t *testing.T) {
	env := newFakeEnv(t)
	staging := stageFake(t, env) // the fake device is no device node: never "in place"
	ctx := context.Background()
	target := filepath.Join(env.dir, "pods", "p1", "volume")
	pub := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	ok(t)(env.driver.NodePublishVolume(ctx, pub))
	ok(t)(env.driver.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, VolumeContext: nvmeContext(),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}))
	rec, err := env.store.Get("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) != 1 || rec.Publications[0].TargetPath != target {
		t.Fatalf("publications after the restage: %+v, want %s", rec.Publications, target)
	}
	_, err = env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
	ok(t)(env.driver.NodePublishVolume(ctx, pub))
}
