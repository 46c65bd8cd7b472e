package driver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/driver"
)

// The node-side MUSTs of csi.proto that pathmend could break, one test
// each (or a pointer to the test that pins it):
//
//   - accessible_topology needs VOLUME_ACCESSIBILITY_CONSTRAINTS:
//     TestSpec_TopologyImpliesAccessibilityConstraints
//   - node_id SHALL NOT exceed 256 bytes; topology keys and values follow
//     the Topology message's rules: TestSpec_NodeInfoFieldsFollowTheSpec
//   - max_volumes_per_node MUST NOT be negative: TestNew_Rejects
//   - paths: SP MUST accept at least 128 bytes: TestDoor_AcceptsTheLimits
//   - "Staging target path not set" is FAILED_PRECONDITION:
//     TestNodePublish_BadInput
//   - NodeUnpublishVolume: the SP MUST delete the file or directory it
//     created: TestSpec_UnpublishDeletesWhatItCreated
//   - NodeStage, NodePublish, NodeUnpublish, NodeUnstage are idempotent:
//     TestSpec_RepeatedCallsAreIdempotent (and the lifecycle tests)
//   - SINGLE_NODE_MULTI_WRITER advertised: SINGLE_NODE_WRITER MUST still
//     be accepted: TestSpec_SingleNodeWriterStillAccepted
//   - mount_flags MUST NOT leak: TestSpec_MountFlagsNeverRepeated
//   - secrets never logged: TestCredentialsNeverLogged_V10
//   - StorageBackendHealth: no two entries with the same (status, reason):
//     NodeGetStorageHealth groups by exactly that key (node_health.go)

func TestSpec_TopologyImpliesAccessibilityConstraints(t *testing.T) {
	ctx := context.Background()
	hasConstraints := func(d *driver.Driver) bool {
		caps, err := d.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range caps.GetCapabilities() {
			if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
				return true
			}
		}
		return false
	}
	env := newFakeEnv(t)
	info, err := env.driver.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetAccessibleTopology() != nil || hasConstraints(env.driver) {
		t.Errorf("no topology configured: topology %v, constraints %t; want neither", info.GetAccessibleTopology(), hasConstraints(env.driver))
	}

	cfg := testConfig("ext4")
	cfg.TopologyKey, cfg.TopologyValue = "topology.pathmend.io/zone", "z1"
	d, err := driver.New(cfg, depsFor(t, &fakeAttacher{}))
	if err != nil {
		t.Fatal(err)
	}
	info, err = d.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetAccessibleTopology() == nil || !hasConstraints(d) {
		t.Errorf("topology configured: topology %v, constraints %t; want both", info.GetAccessibleTopology(), hasConstraints(d))
	}
}

func TestSpec_NodeInfoFieldsFollowTheSpec(t *testing.T) {
	for _, tc := range []struct {
		name       string
		nodeID     string
		key, value string
		ok         bool
	}{
		{"node ID of 256 bytes", strings.Repeat("n", 256), "", "", true},
		{"node ID of 257 bytes", strings.Repeat("n", 257), "", "", false},
		{"key without prefix", "n", "zone", "z1", true},
		{"key with prefix", "n", "topology.pathmend.io/zone", "eu-west-1a", true},
		{"name of 63 characters", "n", strings.Repeat("z", 63), "v", true},
		{"name of 64 characters", "n", strings.Repeat("z", 64), "v", false},
		{"name ends with a dash", "n", "zone-", "v", false},
		{"name with a space", "n", "my zone", "v", false},
		{"upper-case prefix", "n", "Topology.example/zone", "v", false},
		{"empty prefix", "n", "/zone", "v", false},
		{"prefix label ends with a dash", "n", "a-.example/zone", "v", false},
		{"two slashes", "n", "a.example/b/zone", "v", false},
		{"value of 64 characters", "n", "zone", strings.Repeat("v", 64), false},
		{"value with a slash", "n", "zone", "a/b", false},
		{"value starts with a dot", "n", "zone", ".a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("ext4")
			cfg.NodeID, cfg.TopologyKey, cfg.TopologyValue = tc.nodeID, tc.key, tc.value
			_, err := driver.New(cfg, depsFor(t, &fakeAttacher{}))
			if (err == nil) != tc.ok {
				t.Errorf("New = %v, want ok=%t", err, tc.ok)
			}
		})
	}
}

func TestSpec_UnpublishDeletesWhatItCreated(t *testing.T) {
	env := newFakeEnv(t)
	staging := stageFake(t, env)
	ctx := context.Background()
	target := filepath.Join(env.dir, "pods", "p1", "dev")
	ok(t)(env.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}))
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("publish made no target file: %v", err)
	}
	ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target file publish made is still there: %v", err)
	}
	rec, err := env.store.Get("vol-1")
	if err != nil || len(rec.Publications) != 0 {
		t.Errorf("record after unpublish: %+v, %v", rec.Publications, err)
	}
}

func TestSpec_RepeatedCallsAreIdempotent(t *testing.T) {
	env := newFakeEnv(t)
	ctx := context.Background()
	staging := stageFake(t, env)
	stage := &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, VolumeContext: nvmeContext(),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	target := filepath.Join(env.dir, "pods", "p1", "dev")
	pub := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	for range 2 {
		ok(t)(env.driver.NodeStageVolume(ctx, stage))
	}
	for range 2 {
		ok(t)(env.driver.NodePublishVolume(ctx, pub))
	}
	for range 2 {
		ok(t)(env.driver.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	}
	for range 2 {
		ok(t)(env.driver.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging}))
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target after unpublish: %v", err)
	}
	if _, err := env.store.Get("vol-1"); err == nil {
		t.Error("record left after unstage")
	}
	if got := env.attacher.Calls(); got[len(got)-1] != "detach vol-1" || slices.Index(got, "detach vol-1") != len(got)-1 {
		t.Errorf("attacher calls = %v, want one detach, last", got)
	}
}

func TestSpec_SingleNodeWriterStillAccepted(t *testing.T) {
	env := newFakeEnv(t)
	caps, err := env.driver.NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	multi := false
	for _, c := range caps.GetCapabilities() {
		multi = multi || c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER
	}
	if !multi {
		t.Skip("SINGLE_NODE_MULTI_WRITER is not advertised; the MUST does not apply")
	}
	staging := stageFake(t, env) // stages with SINGLE_NODE_WRITER
	ok(t)(env.driver.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: filepath.Join(env.dir, "t"),
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	}))
}

// TestSpec_MountFlagsNeverRepeated: csi.proto says mount_flags MAY hold
// sensitive information the plugin MUST NOT leak; no error repeats them.
func TestSpec_MountFlagsNeverRepeated(t *testing.T) {
	env := newFakeEnv(t)
	ctx := context.Background()
	staging := mkdir(t, env.dir, "staging")
	secretFlag := "password=mount-flag-secret-1"
	_, err := env.driver.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, VolumeContext: nvmeContext(),
		VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, secretFlag, "bad flag"),
	})
	wantCode(t, err, codes.InvalidArgument)
	if strings.Contains(err.Error(), "mount-flag-secret") || strings.Contains(err.Error(), "bad flag") {
		t.Errorf("error repeats a mount flag: %v", err)
	}
	if _, err := os.Stat(filepath.Join(env.dir, "never")); err == nil {
		t.Fatal("unexpected file")
	}
}
