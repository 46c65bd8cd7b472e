package driver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/volume"
)

// What a record's layers mean after the plugin restarts in a new mount
// namespace, after the node reboots, and in a record written before
// layers were kept; each on the in-memory table with a staged and
// published volume.

func stagedAndPublished(t *testing.T) (*rollbackEnv, string) {
	t.Helper()
	ctx := context.Background()
	e := newRollbackEnv(t)
	ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
	target := filepath.Join(mkdir(t, e.dir, "pods", "p1"), "mount")
	ok(t)(e.drv.NodePublishVolume(ctx, e.pubReq(target)))
	return e, target
}

func recordOf(t *testing.T, e *rollbackEnv) volume.Record {
	t.Helper()
	r, err := e.store.Get("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLayers_ANewMountNamespaceKeepsTheVolumesLayers: a restarted plugin
// container sees every mount under a new ID; the volume's layers are
// still told by what they show, recorded anew by NodeStage and
// NodePublish, and released by NodeUnpublish and NodeUnstage; a foreign
// layer is still refused.
func TestLayers_ANewMountNamespaceKeepsTheVolumesLayers(t *testing.T) {
	ctx := context.Background()
	e, target := stagedAndPublished(t)
	before := recordOf(t, e)
	e.tb.NewNamespace()
	ns, _ := e.tb.Namespace()
	ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
	ok(t)(e.drv.NodePublishVolume(ctx, e.pubReq(target)))
	after := recordOf(t, e)
	if after.StagingLayer.Namespace != ns.Mount || after.StagingLayer.ID == before.StagingLayer.ID {
		t.Errorf("the staging layer is not recorded in the new namespace: %+v (was %+v)", after.StagingLayer, before.StagingLayer)
	}
	if l := after.Publications[0].Layer; l.Namespace != ns.Mount || l.ID == before.Publications[0].Layer.ID {
		t.Errorf("the publication's layer is not recorded in the new namespace: %+v", l)
	}
	// In yet another namespace, without a NodeStage or NodePublish first.
	e.tb.NewNamespace()
	ok(t)(e.drv.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	ok(t)(e.drv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging}))
	if n := len(e.tb.Snapshot().Layers()); n != 1 {
		t.Errorf("%d mounts left, want only the root", n)
	}
}

// TestLayers_AnUpgradedPodWhoseNamespaceReusesTheNumber: the plugin pod
// replaced by an upgrade runs in a new mount namespace that the kernel
// gave the inode number of the one it replaced (/proc/self/ns/mnt reads
// the same), with every mount under a new ID. The new process must not
// take the recorded IDs for its own: the volume's layers are matched by
// what they show, so NodeGetVolumeStats, NodeUnpublish and NodeUnstage
// work without a NodeStage or NodePublish first (in the lab every one
// of them failed FailedPrecondition after an upgrade, naming the
// volume's own mount as foreign).
func TestLayers_AnUpgradedPodWhoseNamespaceReusesTheNumber(t *testing.T) {
	ctx := context.Background()
	e, target := stagedAndPublished(t)
	before := recordOf(t, e)
	e.tb.NewNamespace()
	ns, _ := e.tb.Namespace()
	link := func(s string) string { return strings.Fields(s)[0] }
	if link(ns.Mount) != link(before.StagingLayer.Namespace) {
		t.Fatalf("the new namespace %q does not reuse the link of %q", ns.Mount, before.StagingLayer.Namespace)
	}
	if ns.Mount == before.StagingLayer.Namespace {
		t.Fatalf("the new process's namespace %q is the recorded one", ns.Mount)
	}
	if _, err := e.drv.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: target}); err != nil {
		t.Errorf("NodeGetVolumeStats after the upgrade: %v", err)
	}
	ok(t)(e.drv.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	ok(t)(e.drv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging}))
	if n := len(e.tb.Snapshot().Layers()); n != 1 {
		t.Errorf("%d mounts left, want only the root", n)
	}
}

// TestLayers_AfterAReboot: every mount is gone and the recorded layers
// name another boot; kubelet stages and publishes again, and the new
// mounts are recorded in the new boot.
func TestLayers_AfterAReboot(t *testing.T) {
	ctx := context.Background()
	e, target := stagedAndPublished(t)
	before := recordOf(t, e)
	e.tb.Reboot()
	ns, _ := e.tb.Namespace()
	// A foreign mount of the new boot that reuses an old ID is not taken
	// for the volume's.
	e.tb.Foreign(e.staging, "tmpfs", "after-reboot", false)
	_, err := e.drv.NodeStageVolume(ctx, e.stageReq())
	wantCode(t, err, codes.FailedPrecondition)
	e.tb.RemoveForeign(e.tb.ForeignLayers()[0].ID)
	ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
	ok(t)(e.drv.NodePublishVolume(ctx, e.pubReq(target)))
	after := recordOf(t, e)
	if after.StagingLayer.Boot != ns.Boot || after.StagingLayer.Boot == before.StagingLayer.Boot {
		t.Errorf("staging layer %+v: want the new boot %s", after.StagingLayer, ns.Boot)
	}
	if l := after.Publications[0].Layer; l.Boot != ns.Boot {
		t.Errorf("publication layer %+v: want the new boot", l)
	}
	ok(t)(e.drv.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	ok(t)(e.drv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging}))
}

// TestLayers_UpgradeFromARecordWithoutLayers: a version 2 record (no
// layers, no publication marked created) still reads; its mounts are the
// volume's by what they show; NodeStage and NodePublish record them;
// NodeUnpublish leaves the target for kubelet (pathmend cannot tell it
// created it).
func TestLayers_UpgradeFromARecordWithoutLayers(t *testing.T) {
	ctx := context.Background()
	e, target := stagedAndPublished(t)
	downgrade := func() {
		t.Helper()
		path := e.store.RecordPath("vol-1")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["version"] = 2
		delete(m, "stagingLayer")
		for _, p := range m["publications"].([]any) {
			delete(p.(map[string]any), "layer")
			delete(p.(map[string]any), "created")
		}
		b, _ = json.Marshal(m)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	downgrade()
	if r := recordOf(t, e); r.StagingLayer != nil || r.Publications[0].Layer != nil {
		t.Fatalf("the version 2 record reads with layers: %+v", r)
	}
	ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
	ok(t)(e.drv.NodePublishVolume(ctx, e.pubReq(target)))
	if r := recordOf(t, e); r.StagingLayer == nil || r.StagingLayer.ID == 0 || r.Publications[0].Layer == nil || r.Publications[0].Layer.ID == 0 {
		t.Errorf("the mounts in place were not recorded: %+v", r)
	}
	// Released straight from a version 2 record, too.
	downgrade()
	ok(t)(e.drv.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
	if _, err := os.Stat(target); err != nil {
		t.Errorf("the target of a version 2 publication was removed: %v", err)
	}
	ok(t)(e.drv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging}))
	var ours []mounts.Layer
	for _, l := range e.tb.Snapshot().Layers() {
		if l.MountPoint != "/" {
			ours = append(ours, l)
		}
	}
	if len(ours) != 0 {
		t.Errorf("mounts left: %v", ours)
	}
}
