package driver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/volume"
)

// The kernel replaced a staged volume's block device (every path lost for
// a while: Linux removed the device, and the returning paths made a new
// one) while its filesystem stayed mounted on the old one, on real loop
// devices and mounts. The volume is INACCESSIBLE (StagedDeviceReplaced)
// in NodeGetVolumeHealth and NodeGetStorageHealth however healthy its
// paths are, and NodeGetVolumeStats reports no usage for it; a NodeStage
// retried while a pod still has it published answers FailedPrecondition
// saying the pods must be restarted — not AlreadyExists about its own
// dead mount — and once the publication is gone, restages it on the new
// device with the data intact.
func TestStage_AReplacedDeviceIsReportedAndRestaged(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnv(t, dir, "ext4")
	vol := env.createVolume(t, "replaced", 64<<20)
	staging := mkdir(t, dir, "staging")
	cap := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap, VolumeContext: vol.VolumeContext}
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	rec, _ := env.store.Get(vol.VolumeId)
	if rec.DevNum.IsZero() {
		t.Fatalf("the record keeps no device number: %+v", rec)
	}
	target := filepath.Join(dir, "pods", "a")
	ok(t)(env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}))
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	syncFS(t, target)
	if hs := volumeHealth(t, env, vol.VolumeId); len(hs) != 0 {
		t.Fatalf("health before the replacement = %v", hs)
	}

	old, replacement, err := env.attacher.Replace(ctx, vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replaced %s by %s", old, replacement)
	hs := volumeHealth(t, env, vol.VolumeId)
	if len(hs) != 1 || hs[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE || hs[0].GetReason() != volume.ReasonStagedDeviceReplaced {
		t.Fatalf("health after the replacement = %v", hs)
	}
	for _, s := range []string{"the staging mount at " + staging, filepath.Base(old) + " (", "now " + filepath.Base(replacement) + " (", "restart the pods"} {
		if !strings.Contains(hs[0].GetMessage(), s) {
			t.Errorf("health message %q lacks %q", hs[0].GetMessage(), s)
		}
	}
	sh, err := env.driver.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !hasBackend(sh, csi.StorageHealthErrorType_STORAGE_UNREACHABLE, volume.ReasonStagedDeviceReplaced) {
		t.Errorf("storage health = %v, %v", sh, err)
	}
	_, err = env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: target})
	wantCode(t, err, codes.FailedPrecondition)

	// Retried while published: the pods must be restarted.
	_, err = env.driver.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition)
	if msg := status.Convert(statusOf(err)).Message(); !strings.Contains(msg, "published at "+target) || !strings.Contains(msg, "restart the pods") {
		t.Errorf("stage error %q does not say the pods must be restarted", msg)
	}

	// Once unpublished: restaged on the new device, the data intact.
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	rec, _ = env.store.Get(vol.VolumeId)
	if rec.Device != replacement {
		t.Errorf("record device after the restage = %s, want %s", rec.Device, replacement)
	}
	if b, err := os.ReadFile(filepath.Join(staging, "keep")); err != nil || string(b) != "data" {
		t.Errorf("data after the restage: %q, %v", b, err)
	}
	if hs := volumeHealth(t, env, vol.VolumeId); len(hs) != 0 {
		t.Errorf("health after the restage = %v", hs)
	}
	ok(t)(env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: staging}))
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
}

// The same for a raw block volume: its users hold the device node bound
// at the publication, whose number is the removed device's.
func TestStage_AReplacedBlockDeviceIsReportedAndRestaged(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnv(t, dir, "ext4")
	vol := env.createVolume(t, "replaced-block", 64<<20)
	staging := mkdir(t, dir, "staging")
	cap := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap, VolumeContext: vol.VolumeContext}
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	target := filepath.Join(dir, "pods", "dev")
	ok(t)(env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}))
	_, replacement, err := env.attacher.Replace(ctx, vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	hs := volumeHealth(t, env, vol.VolumeId)
	if len(hs) != 1 || hs[0].GetReason() != volume.ReasonStagedDeviceReplaced || !strings.Contains(hs[0].GetMessage(), "the publication at "+target) {
		t.Fatalf("health after the replacement = %v", hs)
	}
	_, err = env.driver.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition)
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	if rec, _ := env.store.Get(vol.VolumeId); rec.Device != replacement {
		t.Errorf("record device after the restage = %s, want %s", rec.Device, replacement)
	}
	if hs := volumeHealth(t, env, vol.VolumeId); len(hs) != 0 {
		t.Errorf("health after the restage = %v", hs)
	}
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
}

func volumeHealth(t *testing.T, env *testEnv, id string) []*csi.VolumeHealth_VolumeHealthEntry {
	t.Helper()
	resp, err := env.driver.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolumeHealth().GetHealthStatuses()
}

func hasBackend(r *csi.NodeGetStorageHealthResponse, st csi.StorageHealthErrorType, reason string) bool {
	for _, b := range r.GetBackendHealth() {
		if b.GetStatus() == st && b.GetReason() == reason {
			return true
		}
	}
	return false
}

func syncFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestStage_ABlockVolumeWhoseDeviceNumberAnotherDeviceTookIsStagedAgain:
// nothing holds a block volume's device while no pod has it open; after
// a reboot (or once every path went) its device is gone and the kernel
// may give its name and number to another device. kubelet's NodeStage
// must then attach the volume again, never answer "already staged" and
// let NodePublish bind the other device into the pod.
func TestStage_ABlockVolumeWhoseDeviceNumberAnotherDeviceTookIsStagedAgain(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnv(t, dir, "ext4")
	vol := env.createVolume(t, "block-reused", 64<<20)
	staging := mkdir(t, dir, "staging")
	cap := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap, VolumeContext: vol.VolumeContext}
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	rec, err := env.store.Get(vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	old := rec.Device

	// The volume's device goes, and another file takes its loop device
	// (a loop device's node keeps its name and number: 7:N).
	if out, err := exec.Command("losetup", "-d", old).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v: %s", old, err, out)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", old, other).CombinedOutput(); err != nil {
		// Another process's loop device took it first: the same case.
		t.Logf("losetup %s %s: %v: %s", old, other, err, out)
	} else {
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", old).Run() })
	}
	if n, _ := volume.NodeNumber(old); n != rec.DevNum {
		t.Fatalf("%s is now %s, want the volume's old number %s", old, n, rec.DevNum)
	}

	attaches := env.attacher.Attaches
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	if env.attacher.Attaches != attaches+1 {
		t.Errorf("NodeStage answered without attaching the volume again (%d attaches, want %d)", env.attacher.Attaches, attaches+1)
	}
	after, err := env.store.Get(vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	if after.Device == old || after.DevNum == rec.DevNum {
		t.Fatalf("the record still names %s (%s), now another file's device", after.Device, after.DevNum)
	}
	target := filepath.Join(dir, "pods", "dev")
	ok(t)(env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}))
	if n, _ := volume.NodeNumber(target); n != after.DevNum {
		t.Errorf("the publication is device %s, want the volume's %s", n, after.DevNum)
	}
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
}
