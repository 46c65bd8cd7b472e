package driver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/driver"
)

// maxMessage bounds every error message the door returns: it names the
// field and the limit and repeats nothing of the value.
const maxMessage = 256

// bigMap returns a string map whose keys and values total n bytes.
func bigMap(n int) map[string]string {
	return map[string]string{"k": strings.Repeat("v", n-1)}
}

// TestDoor_RefusesOverLimitFields sends, through the real gRPC server,
// every request field pathmend reads one byte over its CSI limit: each is
// InvalidArgument naming the field and the limit before any handler runs
// (nothing attached, mounted or recorded), with a bounded message.
func TestDoor_RefusesOverLimitFields(t *testing.T) {
	env := newFakeEnv(t)
	node := csi.NewNodeClient(serveOnSocket(t, env.driver))
	ctx := context.Background()
	staging := mkdir(t, env.dir, "staging")
	target := filepath.Join(env.dir, "target")
	longID := strings.Repeat("v", 129)
	longPath := "/" + strings.Repeat("p", 4095)
	stage := func(mod func(r *csi.NodeStageVolumeRequest)) func() error {
		return func() error {
			r := &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging,
				VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), VolumeContext: nvmeContext()}
			mod(r)
			_, err := node.NodeStageVolume(ctx, r)
			return err
		}
	}
	publish := func(mod func(r *csi.NodePublishVolumeRequest)) func() error {
		return func() error {
			r := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target,
				VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
			mod(r)
			_, err := node.NodePublishVolume(ctx, r)
			return err
		}
	}
	for _, tc := range []struct {
		name, field, limit string
		call               func() error
	}{
		{"stage: a 1.1 MiB volume_id", "volume_id", "limit for a string is 128 bytes",
			stage(func(r *csi.NodeStageVolumeRequest) { r.VolumeId = strings.Repeat("v", 1100<<10) })},
		{"stage: a 129-byte volume_id", "volume_id is 129 bytes", "128 bytes", stage(func(r *csi.NodeStageVolumeRequest) { r.VolumeId = longID })},
		{"stage: volume_context over 4 KiB", "volume_context is 4097 bytes", "limit for a map (keys and values together) is 4096 bytes",
			stage(func(r *csi.NodeStageVolumeRequest) { r.VolumeContext = bigMap(4097) })},
		{"stage: 160,000 endpoints", "volume_context", "4096 bytes", stage(func(r *csi.NodeStageVolumeRequest) {
			r.VolumeContext["endpoints"] = endpointList(160000)
		})},
		{"stage: a 1 MiB key", "volume_context", "4096 bytes", stage(func(r *csi.NodeStageVolumeRequest) {
			r.VolumeContext[strings.Repeat("k", 1<<20)] = "x"
		})},
		{"stage: publish_context over 4 KiB", "publish_context", "4096 bytes", stage(func(r *csi.NodeStageVolumeRequest) { r.PublishContext = bigMap(4097) })},
		{"stage: secrets over 4 KiB", "secrets", "4096 bytes", stage(func(r *csi.NodeStageVolumeRequest) { r.Secrets = bigMap(4097) })},
		{"stage: staging path over PATH_MAX", "staging_target_path is 4097 bytes", "limit for a path is 4095 bytes",
			stage(func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = longPath + "x" })},
		{"stage: staging path with a line break", "staging_target_path contains a control character", "",
			stage(func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = staging + "\n/x" })},
		{"stage: fs_type", "volume_capability.mount.fs_type", "128 bytes", stage(func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = mountCap(strings.Repeat("x", 129), csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		})},
		{"stage: mount_flags over 4 KiB together", "volume_capability.mount.mount_flags", "mount_flags (all flags together) is 4096 bytes",
			stage(func(r *csi.NodeStageVolumeRequest) {
				r.VolumeCapability = mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, strings.Repeat("a", 2048), strings.Repeat("b", 2049))
			})},
		{"stage: volume_mount_group", "volume_capability.mount.volume_mount_group", "128 bytes", stage(func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability.GetMount().VolumeMountGroup = strings.Repeat("g", 129)
		})},
		{"unstage: volume_id", "volume_id", "128 bytes", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: longID, StagingTargetPath: staging})
			return err
		}},
		{"unstage: staging path", "staging_target_path", "4095 bytes", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: longPath + "x"})
			return err
		}},
		{"publish: volume_context", "volume_context", "4096 bytes", publish(func(r *csi.NodePublishVolumeRequest) { r.VolumeContext = bigMap(4097) })},
		{"publish: publish_context", "publish_context", "4096 bytes", publish(func(r *csi.NodePublishVolumeRequest) { r.PublishContext = bigMap(4097) })},
		{"publish: secrets", "secrets", "4096 bytes", publish(func(r *csi.NodePublishVolumeRequest) { r.Secrets = bigMap(4097) })},
		{"publish: target path", "target_path", "4095 bytes", publish(func(r *csi.NodePublishVolumeRequest) { r.TargetPath = longPath + "x" })},
		{"unpublish: volume_id", "volume_id", "128 bytes", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: longID, TargetPath: target})
			return err
		}},
		{"unpublish: target path with NUL", "target_path contains a control character", "", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target + "\x00"})
			return err
		}},
		{"stats: volume_path", "volume_path", "4095 bytes", func() error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: longPath + "x"})
			return err
		}},
		{"stats: staging path", "staging_target_path", "4095 bytes", func() error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: target, StagingTargetPath: longPath + "x"})
			return err
		}},
		{"expand: volume_id", "volume_id", "128 bytes", func() error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: longID, VolumePath: target})
			return err
		}},
		{"expand: secrets", "secrets", "4096 bytes", func() error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: target, Secrets: bigMap(4097)})
			return err
		}},
		{"health: volume_publish_path", "volume_publish_path", "4095 bytes", func() error {
			_, err := node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-1", VolumePublishPath: longPath + "x"})
			return err
		}},
		{"storage health: secrets", "secrets", "4096 bytes", func() error {
			_, err := node.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{Secrets: bigMap(4097)})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			msg := status.Convert(err).Message()
			if !strings.Contains(msg, tc.field) || !strings.Contains(msg, tc.limit) {
				t.Errorf("message %q does not name %q and %q", msg, tc.field, tc.limit)
			}
			if len(msg) > maxMessage {
				t.Errorf("message is %d bytes, want at most %d: %.300s", len(msg), maxMessage, msg)
			}
			assertUntouched(t, env)
		})
	}
}

// endpointList lists n distinct endpoints, as a hostile context would.
func endpointList(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("10.%d.%d.%d:4420", i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return strings.Join(items, ",")
}

// TestDoor_AcceptsTheLimits: a request with every field exactly at its
// limit passes the door; what answers is the handler (here a stage that
// succeeds). The spec: "SP MUST accept a max path length of at least 128
// bytes"; pathmend accepts PATH_MAX.
func TestDoor_AcceptsTheLimits(t *testing.T) {
	env := newFakeEnv(t)
	node := csi.NewNodeClient(serveOnSocket(t, env.driver))
	ctx := context.Background()
	staging := mkdir(t, env.dir, "staging")
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	vc := nvmeContext()
	size := 0
	for k, v := range vc {
		size += len(k) + len(v)
	}
	const pad = "csi.storage.k8s.io/pad"
	vc[pad] = strings.Repeat("p", 4096-size-len(pad))
	id := strings.Repeat("i", 128)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeContext: vc, PublishContext: bigMap(4096), Secrets: bigMap(4096),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}); err == nil || !strings.Contains(err.Error(), `publish context key "k"`) {
		t.Fatalf("stage at the limits: %v, want the parser's refusal of the padding key", err)
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeContext: vc,
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}); err != nil {
		t.Fatalf("stage at the limits: %v", err)
	}
	// Mount flags of 4 KiB together, a 4095-byte path: past the door, the
	// handler answers.
	long := "/" + strings.Repeat("p", 4094)
	_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: "vol-unknown", StagingTargetPath: staging, TargetPath: long,
		VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, strings.Repeat("a", 2048), strings.Repeat("b", 2048)),
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not staged") {
		t.Errorf("publish at the limits: %v, want the handler's FailedPrecondition", err)
	}
	_, err = node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: long})
	if msg := status.Convert(err).Message(); strings.Contains(msg, "CSI limit") {
		t.Errorf("a 4095-byte path was refused by the door: %v", err)
	}
}

// TestDoor_KubeletRoot: with a kubelet root configured, every path a
// request carries must be inside it (after cleaning); outside is
// InvalidArgument naming the flag, before anything is touched.
func TestDoor_KubeletRoot(t *testing.T) {
	env := newFakeEnv(t)
	root := mkdir(t, env.dir, "kubelet")
	cfg := testConfig("ext4")
	cfg.KubeletRoot = root
	deps := depsFor(t, env.attacher)
	deps.Intents = ownerOf(t, env.store)
	d, err := driver.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	node := csi.NewNodeClient(serveOnSocket(t, d))
	ctx := context.Background()
	inside := mkdir(t, root, "plugins", "kubernetes.io", "csi", "staging")
	for _, p := range []string{
		"/etc",
		filepath.Join(env.dir, "kubelet-other"),
		root + "/../etc",
	} {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: p})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--kubelet-root") {
			t.Errorf("unstage at %s: %v, want InvalidArgument naming --kubelet-root", p, err)
		}
		_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: p})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("unpublish at %s: %v, want InvalidArgument", p, err)
		}
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: inside}); err != nil {
		t.Errorf("unstage inside the kubelet root: %v", err)
	}
	// The root itself is no place for a mount: a bind there would hide
	// every pod volume, plugin socket and staging mount under it.
	for _, p := range []string{root, root + "/", root + "/pods/.."} {
		_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: inside, TargetPath: p,
			VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "kubelet root directory itself") {
			t.Errorf("publish at %s: %v, want InvalidArgument: the kubelet root itself", p, err)
		}
		_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: p, VolumeContext: nvmeContext(),
			VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "kubelet root directory itself") {
			t.Errorf("stage at %s: %v, want InvalidArgument: the kubelet root itself", p, err)
		}
	}
	if calls := env.attacher.Calls(); len(calls) != 0 {
		t.Errorf("the attacher was called: %v", calls)
	}
	if _, err := driver.New(driver.Config{DriverName: "d", NodeID: "n", HealMode: "observe", KubeletRoot: "var/lib/kubelet"}, deps); err == nil {
		t.Error("New accepted a relative kubelet root")
	}
}
