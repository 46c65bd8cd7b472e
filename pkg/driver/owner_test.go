package driver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// stageFake stages vol-1 for block access in a fake env (the fake mounter
// formats nothing) and returns its staging path.
func stageFake(t *testing.T, env *fakeEnv) string {
	t.Helper()
	staging := mkdir(t, env.dir, "staging")
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ok(t)(env.driver.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, VolumeContext: nvmeContext(),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}))
	return staging
}

func mountedAt(m *mountstest.Table, path string) bool {
	mnt, _ := m.IsMountPoint(path)
	return mnt
}

// TestUnmount_OnlyWhatIsOurs: NodeUnpublishVolume and NodeUnstageVolume
// unmount only the layers the volume's record names; at a path the record
// does not name, any mount is refused with FailedPrecondition and left in
// place with what is under it (a publication is recorded before its bind,
// so pathmend never made one there), and a path with nothing mounted is
// left alone and answered OK.
func TestUnmount_OnlyWhatIsOurs(t *testing.T) {
	ctx := context.Background()
	t.Run("unpublish: a foreign mount at the target of a staged volume", func(t *testing.T) {
		env := newFakeEnv(t)
		stageFake(t, env)
		target := mkdir(t, env.dir, "foreign")
		env.mounter.Foreign(target, "tmpfs", "tmpfs", false)
		_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target})
		wantCode(t, err, codes.FailedPrecondition)
		if !mountedAt(env.mounter, target) {
			t.Error("the foreign mount was unmounted")
		}
		if _, err := os.Stat(target); err != nil {
			t.Errorf("the foreign directory is gone: %v", err)
		}
	})
	t.Run("unpublish: a foreign mount, no record", func(t *testing.T) {
		env := newFakeEnv(t)
		target := mkdir(t, env.dir, "foreign")
		env.mounter.Foreign(target, "tmpfs", "tmpfs", false)
		_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-x", TargetPath: target})
		wantCode(t, err, codes.FailedPrecondition)
		if !mountedAt(env.mounter, target) {
			t.Error("the foreign mount was unmounted")
		}
	})
	t.Run("unpublish: a foreign file with nothing mounted stays", func(t *testing.T) {
		env := newFakeEnv(t)
		stageFake(t, env)
		file := filepath.Join(env.dir, "precious")
		if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: file}))
		if _, err := os.Stat(file); err != nil {
			t.Errorf("an unmounted path that is no publication was removed: %v", err)
		}
	})
	t.Run("unpublish: an unrecorded bind of the device node is not the volume's", func(t *testing.T) {
		// NodePublish records a publication before its bind: a bind the
		// record does not name was made by someone else.
		env := newFakeEnv(t)
		stageFake(t, env)
		target := filepath.Join(mkdir(t, env.dir, "pod"), "dev")
		if err := os.WriteFile(target, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := env.mounter.Mount(env.attacher.device, target, "", []string{"bind"}); err != nil {
			t.Fatal(err)
		}
		_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target})
		wantCode(t, err, codes.FailedPrecondition)
		if !mountedAt(env.mounter, target) {
			t.Error("the bind no record names was unmounted")
		}
	})
	t.Run("unstage: a mount at the staging path of a volume without a record", func(t *testing.T) {
		env := newFakeEnv(t)
		staging := mkdir(t, env.dir, "staging")
		env.mounter.Foreign(staging, "tmpfs", "tmpfs", false)
		_, err := env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: staging})
		wantCode(t, err, codes.FailedPrecondition)
		if !mountedAt(env.mounter, staging) {
			t.Error("the foreign mount was unmounted")
		}
	})
	t.Run("unstage: nothing mounted and no record is OK", func(t *testing.T) {
		env := newFakeEnv(t)
		staging := mkdir(t, env.dir, "staging")
		ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: staging}))
		if _, err := os.Stat(staging); err != nil {
			t.Errorf("staging directory removed: %v", err)
		}
	})
}

// TestPublish_BoundedPublications: a volume published at MaxPublications
// targets takes no more (its record would outgrow what the store reads);
// a publication it already has stays idempotent.
func TestPublish_BoundedPublications(t *testing.T) {
	env := newFakeEnv(t)
	staging := stageFake(t, env)
	rec, err := env.store.Get("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range volume.MaxPublications {
		rec.Publications = append(rec.Publications, volume.Publication{TargetPath: filepath.Join(env.dir, "pods", strconv.Itoa(i))})
	}
	if err := env.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	_, err = env.driver.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: filepath.Join(env.dir, "one-more"),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER),
	})
	wantCode(t, err, codes.ResourceExhausted)
}

// TestPublish_ContextMustMatchTheStagedOne: the volume and publish
// contexts a NodePublishVolume carries are parsed like NodeStage's and
// must describe the staged volume; Kubernetes' own keys alone change
// nothing.
func TestPublish_ContextMustMatchTheStagedOne(t *testing.T) {
	env := newFakeEnv(t)
	staging := stageFake(t, env)
	ctx := context.Background()
	pub := func(target string, vc, pc map[string]string) error {
		_, err := env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: filepath.Join(env.dir, target),
			VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER),
			VolumeContext:    vc, PublishContext: pc,
		})
		return err
	}
	ok(t)(nil, pub("t1", nvmeContext(), nil))
	ok(t)(nil, pub("t2", map[string]string{"csi.storage.k8s.io/pod.name": "p"}, nil))
	split := nvmeContext()
	delete(split, "nsid")
	ok(t)(nil, pub("t3", split, map[string]string{"nsid": "1"}))
	other := nvmeContext()
	other["nsid"] = "2"
	wantCode(t, pub("t4", other, nil), codes.FailedPrecondition)
	wantCode(t, pub("t5", nvmeContext(), map[string]string{"nsid": "2"}), codes.InvalidArgument)
}

// TestUnmount_ForeignTmpfsLeftAlone is the hostile case on real mounts: a
// tmpfs mounted somewhere else, handed to NodeUnpublishVolume and
// NodeUnstageVolume as the path of a staged volume, stays mounted with its
// content; so do a bind of the volume's staging mount and of its device
// node that no record names (NodePublish records before it binds).
func TestUnmount_ForeignTmpfsLeftAlone(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnv(t, dir, "ext4")
	vol := env.createVolume(t, "owner", 64<<20)
	staging := mkdir(t, dir, "staging")
	capM := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	ok(t)(env.driver.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: capM, VolumeContext: vol.VolumeContext}))
	t.Cleanup(func() {
		_, _ = env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	})

	foreign := mkdir(t, dir, "foreign")
	mountstest.Tmpfs(t, foreign, "tmpfs")
	if err := os.WriteFile(filepath.Join(foreign, "data"), []byte("not pathmend's"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: foreign})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-unknown", StagingTargetPath: foreign})
	wantCode(t, err, codes.FailedPrecondition)
	if b, err := os.ReadFile(filepath.Join(foreign, "data")); err != nil || string(b) != "not pathmend's" {
		t.Fatalf("the foreign tmpfs lost its content: %q, %v", b, err)
	}

	// A bind of the staging mount that no record lists.
	bound := mkdir(t, dir, "pods", "bound")
	if out, err := exec.Command("mount", "--bind", staging, bound).CombinedOutput(); err != nil {
		t.Fatalf("bind: %v: %s", err, out)
	}
	t.Cleanup(func() { mountstest.UnmountAll(bound) })
	_, err = env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: bound})
	wantCode(t, err, codes.FailedPrecondition)
	if mnt, _ := env.mounter.IsMountPoint(bound); !mnt {
		t.Error("a bind no record names was unmounted")
	}
	rec, err := env.store.Get(vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	// The device node bound onto a file, as a block publication is, that
	// no record lists.
	blockTarget := filepath.Join(dir, "pods", "block")
	if err := os.WriteFile(blockTarget, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", rec.Device, blockTarget).CombinedOutput(); err != nil {
		t.Fatalf("bind device: %v: %s", err, out)
	}
	t.Cleanup(func() { mountstest.UnmountAll(blockTarget) })
	_, err = env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: blockTarget})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := os.Stat(blockTarget); err != nil {
		t.Errorf("block target removed: %v", err)
	}
}
