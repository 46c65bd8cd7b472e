package driver_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// healthOf returns NodeGetVolumeHealth's entries of id as "STATUS Reason".
func healthOf(t *testing.T, env *testEnv, id string) ([]string, []*csi.VolumeHealth_VolumeHealthEntry) {
	t.Helper()
	resp, err := env.driver.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	var out []string
	for _, h := range resp.GetVolumeHealth().GetHealthStatuses() {
		out = append(out, h.GetStatus().String()+" "+h.GetReason())
	}
	return out, resp.GetVolumeHealth().GetHealthStatuses()
}

// The kernel's own error knob on a real ext4, on this machine's kernel: a
// filesystem error with errors=remount-ro (pathmend's default) stops every
// write while the mount table still says rw. The volume is INACCESSIBLE
// FilesystemReadOnly in NodeGetVolumeHealth (the message naming the
// device and the error count) and NodeGetStorageHealth, NodeGetVolumeStats
// answers FailedPrecondition, and a NodeStage or a second NodePublish
// while a pod holds it answers FailedPrecondition. Once no pod holds it,
// the next NodePublish checks it (fsck -p) and mounts it again: healthy,
// writable, the data written before the error intact.
func TestFilesystem_Ext4ErrorIsReportedAndCheckedBeforeTheNextPod(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnvOn(t, dir, "ext4", sysfs.New("/sys"))
	vol := env.createVolume(t, "fs-error", 64<<20)
	staging := mkdir(t, dir, "staging")
	cap := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap, VolumeContext: vol.VolumeContext}
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	target := filepath.Join(dir, "pods", "a")
	publish := func(target string) error {
		_, err := env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap})
		return err
	}
	ok(t)(nil, publish(target))
	data := bytes.Repeat([]byte("written before the error\n"), 4096)
	writeDurable(t, filepath.Join(target, "before"), data)
	rec, _ := env.store.Get(vol.VolumeId)
	dev := filepath.Base(rec.Device)
	if hs, _ := healthOf(t, env, vol.VolumeId); len(hs) != 0 {
		t.Fatalf("health before the error = %v", hs)
	}
	knob := "/sys/fs/ext4/" + dev + "/trigger_fs_error"
	if _, err := os.Stat(knob); err != nil {
		testneed.Skip(t, "this kernel has no %s: %v", knob, err)
	}
	if err := os.WriteFile(knob, []byte("pathmend test error"), 0o200); err != nil {
		t.Fatalf("trigger an ext4 error: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "after"), []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("a write after the error: %v, want EROFS (errors=remount-ro)", err)
	}
	hs, entries := healthOf(t, env, vol.VolumeId)
	if len(hs) != 1 || hs[0] != "INACCESSIBLE "+fshealth.ReasonReadOnly {
		t.Fatalf("health after the error = %v", hs)
	}
	for _, s := range []string{"ext4 on " + dev + " (", "is read-only after 1 error", "errors=remount-ro", "restart the volume's pods"} {
		if !strings.Contains(entries[0].GetMessage(), s) {
			t.Errorf("health message lacks %q: %s", s, entries[0].GetMessage())
		}
	}
	sh, err := env.driver.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !hasBackend(sh, csi.StorageHealthErrorType_STORAGE_UNREACHABLE, fshealth.ReasonReadOnly) || !strings.Contains(sh.String(), "the filesystem of 1 volume is read-only") {
		t.Errorf("storage health = %v, %v", sh, err)
	}
	_, err = env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: target})
	wantCode(t, err, codes.FailedPrecondition)

	// While a pod holds it: neither a restage nor a second pod.
	_, err = env.driver.NodeStageVolume(ctx, stage)
	wantCode(t, err, codes.FailedPrecondition)
	if msg := status.Convert(statusOf(err)).Message(); !strings.Contains(msg, "published at "+target) {
		t.Errorf("stage while published: %s", msg)
	}
	wantCode(t, publish(filepath.Join(dir, "pods", "b")), codes.FailedPrecondition)

	// The pod is gone; the next pod's publish checks and mounts it again.
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(nil, publish(target))
	if hs, _ := healthOf(t, env, vol.VolumeId); len(hs) != 0 {
		t.Errorf("health after the check = %v", hs)
	}
	if b, err := os.ReadFile(filepath.Join(target, "before")); err != nil || !bytes.Equal(b, data) {
		t.Errorf("data written before the error: %d bytes, %v", len(b), err)
	}
	if err := os.WriteFile(filepath.Join(target, "after"), []byte("x"), 0o600); err != nil {
		t.Errorf("a write after the check: %v", err)
	}
	if n, _ := os.ReadFile("/sys/fs/ext4/" + dev + "/errors_count"); strings.TrimSpace(string(n)) != "0" {
		t.Errorf("errors_count after the check = %q, want 0 (e2fsck clears the record)", n)
	}
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
}

// XFS's own shutdown ioctl (xfs_io -x -c shutdown) on a real XFS: every
// stat of it answers EIO. The volume is INACCESSIBLE FilesystemShutdown;
// unpublish and unstage still work (the unmount of a shut-down XFS writes
// nothing); the next stage's mount replays the log and the data written
// before is intact.
func TestFilesystem_XFSShutdownIsReportedAndRestaged(t *testing.T) {
	requireMounts(t)
	testneed.Tools(t, map[string]string{"xfs_io": "xfsprogs"}, "xfs_io")
	ctx := context.Background()
	dir := t.TempDir()
	env := newTestEnvOn(t, dir, "xfs", sysfs.New("/sys"))
	vol := env.createVolume(t, "fs-shutdown", 512<<20)
	staging := mkdir(t, dir, "staging")
	cap := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap, VolumeContext: vol.VolumeContext}
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	target := filepath.Join(dir, "pods", "a")
	ok(t)(env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}))
	data := bytes.Repeat([]byte("written before the shutdown\n"), 4096)
	writeDurable(t, filepath.Join(target, "before"), data)
	if out, err := exec.Command("xfs_io", "-x", "-c", "shutdown", staging).CombinedOutput(); err != nil {
		t.Fatalf("xfs_io shutdown: %v: %s", err, out)
	}
	if _, err := os.Stat(target); !errors.Is(err, syscall.EIO) {
		t.Fatalf("stat of a shut-down XFS: %v, want EIO", err)
	}
	hs, entries := healthOf(t, env, vol.VolumeId)
	if len(hs) != 1 || hs[0] != "INACCESSIBLE "+fshealth.ReasonShutdown || !strings.Contains(entries[0].GetMessage(), "replays its log") {
		t.Fatalf("health after the shutdown = %v", entries)
	}
	_, err := env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: target})
	wantCode(t, err, codes.FailedPrecondition)
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}))
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
	ok(t)(env.driver.NodeStageVolume(ctx, stage))
	if hs, _ := healthOf(t, env, vol.VolumeId); len(hs) != 0 {
		t.Errorf("health after the restage = %v", hs)
	}
	if b, err := os.ReadFile(filepath.Join(staging, "before")); err != nil || !bytes.Equal(b, data) {
		t.Errorf("data written before the shutdown: %d bytes, %v", len(b), err)
	}
	ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}))
}

// writeDurable writes data to path and fsyncs the file and its directory.
func writeDurable(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	syncFS(t, filepath.Dir(path))
}
