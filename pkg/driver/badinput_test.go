package driver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodeStage_BadInputChangesNothing pins principle 6: every invalid
// argument is InvalidArgument naming the field, and nothing is attached,
// mounted or recorded.
func TestNodeStage_BadInputChangesNothing(t *testing.T) {
	env := newFakeEnv(t)
	staging := filepath.Join(env.dir, "staging")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(env.dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	good := func() *csi.NodeStageVolumeRequest {
		return &csi.NodeStageVolumeRequest{
			VolumeId:          "vol-1",
			StagingTargetPath: staging,
			VolumeCapability:  mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
			VolumeContext:     nvmeContext(),
		}
	}
	withCtx := func(k, v string) func(*csi.NodeStageVolumeRequest) {
		return func(r *csi.NodeStageVolumeRequest) {
			if v == "" {
				delete(r.VolumeContext, k)
			} else {
				r.VolumeContext[k] = v
			}
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*csi.NodeStageVolumeRequest)
		want   string // must appear in the message
	}{
		{"no volume id", func(r *csi.NodeStageVolumeRequest) { r.VolumeId = "" }, "volume_id"},
		{"no staging path", func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = "" }, "staging_target_path"},
		{"relative staging path", func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = "rel/staging" }, "staging_target_path"},
		{"staging path missing", func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = filepath.Join(env.dir, "nope") }, "does not exist"},
		{"staging path not a directory", func(r *csi.NodeStageVolumeRequest) { r.StagingTargetPath = notDir }, "not a directory"},
		{"no capability", func(r *csi.NodeStageVolumeRequest) { r.VolumeCapability = nil }, "volume_capability"},
		{"unknown access mode", func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = mountCap("ext4", csi.VolumeCapability_AccessMode_UNKNOWN)
		}, "access_mode"},
		{"multi-node writer on a filesystem", func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = mountCap("ext4", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
		}, "access_mode"},
		{"unsupported filesystem", func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = mountCap("btrfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		}, "fs_type"},
		{"empty mount flag", func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "noatime", "")
		}, "mount_flags"},
		{"no access type", func(r *csi.NodeStageVolumeRequest) {
			r.VolumeCapability = &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
		}, "access_type"},
		{"no transport", withCtx("transport", ""), `"transport"`},
		{"unknown transport", withCtx("transport", "fc"), "nvme-tcp"},
		{"bad nqn", withCtx("nqn", "not-an-nqn"), `"nqn"`},
		{"no endpoints", withCtx("endpoints", ""), `"endpoints"`},
		{"endpoint without port", withCtx("endpoints", "127.0.0.1"), `"endpoints"`},
		{"optimized endpoint not listed", withCtx("optimizedEndpoints", "127.0.0.9:4420"), `"optimizedEndpoints"`},
		{"ctrlLossTmo out of range", withCtx("ctrlLossTmo", "-5"), `"ctrlLossTmo"`},
		{"unknown key", withCtx("nqnn", "x"), `"nqnn"`},
		{"iscsi key on nvme", withCtx("iqn", "iqn.2001-04.com.example:t"), `"iqn"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := good()
			tc.mutate(req)
			_, err := env.driver.NodeStageVolume(context.Background(), req)
			err = statusOf(err)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code = %v (%v), want InvalidArgument", status.Code(err), err)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("message %q does not name %s", status.Convert(err).Message(), tc.want)
			}
			assertUntouched(t, env)
		})
	}
}

// assertUntouched fails when anything was attached, mounted or recorded.
func assertUntouched(t *testing.T, env *fakeEnv) {
	t.Helper()
	if calls := env.attacher.Calls(); len(calls) != 0 {
		t.Errorf("attacher called: %v", calls)
	}
	if log := env.mounter.Log(); len(log) != 0 {
		t.Errorf("mounter called: %v", log)
	}
	recs, err := env.store.List()
	if err != nil || len(recs) != 0 {
		t.Errorf("records = %v, %v; want none", recs, err)
	}
}

func TestNodePublish_BadInput(t *testing.T) {
	env := newFakeEnv(t)
	good := func() *csi.NodePublishVolumeRequest {
		return &csi.NodePublishVolumeRequest{
			VolumeId:          "vol-1",
			StagingTargetPath: filepath.Join(env.dir, "staging"),
			TargetPath:        filepath.Join(env.dir, "target"),
			VolumeCapability:  mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*csi.NodePublishVolumeRequest)
		code   codes.Code
		want   string
	}{
		{"no volume id", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = "" }, codes.InvalidArgument, "volume_id"},
		{"no target", func(r *csi.NodePublishVolumeRequest) { r.TargetPath = "" }, codes.InvalidArgument, "target_path"},
		{"relative target", func(r *csi.NodePublishVolumeRequest) { r.TargetPath = "x/y" }, codes.InvalidArgument, "target_path"},
		// The spec's error table: "Staging target path not set" is
		// FAILED_PRECONDITION for a plugin with STAGE_UNSTAGE_VOLUME.
		{"no staging path", func(r *csi.NodePublishVolumeRequest) { r.StagingTargetPath = "" }, codes.FailedPrecondition, "staging_target_path"},
		{"relative staging path", func(r *csi.NodePublishVolumeRequest) { r.StagingTargetPath = "x/y" }, codes.InvalidArgument, "staging_target_path"},
		{"no capability and no staging path", func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability, r.StagingTargetPath = nil, ""
		}, codes.InvalidArgument, "volume_capability"},
		{"bad publish context", func(r *csi.NodePublishVolumeRequest) {
			r.PublishContext = map[string]string{"transport": "nvme-tcp", "nqn": "nqn.2014-08.com.example:a=b"}
		}, codes.InvalidArgument, `publish context key "nqn"`},
		{"no capability", func(r *csi.NodePublishVolumeRequest) { r.VolumeCapability = nil }, codes.InvalidArgument, "volume_capability"},
		{"not staged", func(*csi.NodePublishVolumeRequest) {}, codes.FailedPrecondition, "not staged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := good()
			tc.mutate(req)
			_, err := env.driver.NodePublishVolume(context.Background(), req)
			err = statusOf(err)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %v naming %s", err, tc.code, tc.want)
			}
			if log := env.mounter.Log(); len(log) != 0 {
				t.Errorf("mounter called: %v", log)
			}
			if _, err := os.Stat(req.TargetPath); req.TargetPath != "" && err == nil {
				t.Errorf("target path %s was created", req.TargetPath)
			}
		})
	}
}

func TestOtherRPCs_BadInput(t *testing.T) {
	env := newFakeEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"unstage no id", func() error {
			_, err := env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{StagingTargetPath: "/x"})
			return err
		}, codes.InvalidArgument},
		{"unstage no path", func() error {
			_, err := env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"unpublish no id", func() error {
			_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: "/x"})
			return err
		}, codes.InvalidArgument},
		{"unpublish relative", func() error {
			_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "x"})
			return err
		}, codes.InvalidArgument},
		{"stats no path", func() error {
			_, err := env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"stats unknown volume", func() error {
			_, err := env.driver.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/x"})
			return err
		}, codes.NotFound},
		{"expand no id", func() error {
			_, err := env.driver.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumePath: "/x"})
			return err
		}, codes.InvalidArgument},
		{"expand unknown volume", func() error {
			_, err := env.driver.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: "/x"})
			return err
		}, codes.NotFound},
		{"unstage not staged is OK", func() error {
			_, err := env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: filepath.Join(env.dir, "gone")})
			return err
		}, codes.OK},
		{"unpublish gone is OK", func() error {
			_, err := env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: filepath.Join(env.dir, "gone")})
			return err
		}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(statusOf(tc.call())); got != tc.code {
				t.Errorf("code = %v, want %v", got, tc.code)
			}
		})
	}
}
