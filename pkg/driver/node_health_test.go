package driver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/volume"
)

// kubelet copies health messages into pod status and CSINode, where the
// API server refuses any longer than 1024 bytes and with it the whole
// status update. Every message pathmend answers must fit, however many
// volumes a backend degrades at once.
func TestHealth_MessagesFitWhatKubernetesKeeps(t *testing.T) {
	const k8sMaxMessage = 1024
	env := newFakeEnv(t)
	long := strings.Repeat("path 127.0.0.1:4420 — controller nvme3 connecting; ", 60)
	env.attacher.health = func(volume.Record) volume.Condition {
		return volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: long}
	}
	vctx, _, err := volume.Parse(nvmeContext(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const volumes = 40
	for i := 0; i < volumes; i++ {
		rec := volume.Record{VolumeID: fmt.Sprintf("vol-%02d", i), State: volume.StateStaged, Context: vctx, StagingPath: fmt.Sprintf("/staging/%02d", i), AccessType: volume.AccessBlock, Device: "/dev/nvme0n1"}
		if err := env.store.Put(rec); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()

	vh, err := env.driver.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-00"})
	if err != nil {
		t.Fatal(err)
	}
	entries := vh.GetVolumeHealth().GetHealthStatuses()
	if len(entries) != 1 || entries[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
		t.Fatalf("volume health = %v, want one DEGRADED entry", entries)
	}
	if m := entries[0].GetMessage(); len(m) > k8sMaxMessage || !utf8.ValidString(m) || !strings.HasPrefix(m, long[:100]) {
		t.Errorf("volume health message: %d bytes, valid UTF-8 %v, starts %q", len(m), utf8.ValidString(m), m[:min(len(m), 100)])
	}

	sh, err := env.driver.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	backends := sh.GetBackendHealth()
	if len(backends) != 1 || backends[0].GetStatus() != csi.StorageHealthErrorType_STORAGE_DEGRADED || backends[0].GetReason() != "PathsBelowExpected" {
		t.Fatalf("storage health = %v, want one STORAGE_DEGRADED PathsBelowExpected entry", backends)
	}
	m := backends[0].GetMessage()
	if len(m) > k8sMaxMessage || !utf8.ValidString(m) {
		t.Errorf("storage health message: %d bytes, valid UTF-8 %v", len(m), utf8.ValidString(m))
	}
	named := strings.Count(m, "(volume vol-")
	if !strings.HasSuffix(m, fmt.Sprintf("; and %d more", volumes-named)) {
		t.Errorf("storage health message names %d volumes and does not count the other %d: …%s", named, volumes-named, m[max(0, len(m)-60):])
	}
}

// kubelet's volume health manager (v1.37, gate CSIVolumeHealth) asks for a
// raw block volume with its own global map directory as staging path and
// no publish path, for a filesystem volume with the staging and publish
// paths it used. pathmend answered NotFound to the first, so no raw block
// volume ever had its health in pod status. The CSI spec keeps NotFound
// for a volume that does not exist on the node.
func TestNodeGetVolumeHealth_AnswersForTheVolumeWhicheverPathsKubeletSends(t *testing.T) {
	env := newFakeEnv(t)
	env.attacher.health = func(volume.Record) volume.Condition {
		return volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: "1 of 2 paths live"}
	}
	vctx, _, err := volume.Parse(nvmeContext(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const kubelet = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices"
	rec := volume.Record{VolumeID: "lab-nvme-ns2", State: volume.StateStaged, Context: vctx, StagingPath: kubelet + "/staging/nvme-block",
		AccessType: volume.AccessBlock, Device: "/dev/nvme0n2",
		Publications: []volume.Publication{{TargetPath: kubelet + "/publish/nvme-block/7cc2279a"}}}
	if err := env.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, req := range []*csi.NodeGetVolumeHealthRequest{
		{VolumeId: rec.VolumeID, StagingTargetPath: kubelet + "/nvme-block/dev"}, // kubelet, raw block
		{VolumeId: rec.VolumeID, StagingTargetPath: rec.StagingPath, VolumePublishPath: rec.Publications[0].TargetPath},
		{VolumeId: rec.VolumeID},
	} {
		resp, err := env.driver.NodeGetVolumeHealth(ctx, req)
		if err != nil {
			t.Errorf("NodeGetVolumeHealth(staging %q, publish %q): %v", req.StagingTargetPath, req.VolumePublishPath, err)
			continue
		}
		if hs := resp.GetVolumeHealth().GetHealthStatuses(); len(hs) != 1 || hs[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
			t.Errorf("NodeGetVolumeHealth(staging %q): %v, want the volume's DEGRADED entry", req.StagingTargetPath, hs)
		}
	}
	_, err = env.driver.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: rec.VolumeID, StagingTargetPath: "relative/dev"})
	if status.Code(statusOf(err)) != codes.InvalidArgument || !strings.Contains(err.Error(), "staging_target_path") {
		t.Errorf("a relative staging path: %v, want InvalidArgument naming staging_target_path", err)
	}
	_, err = env.driver.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "lab-nvme-ns9", StagingTargetPath: kubelet + "/nvme-other/dev"})
	if status.Code(statusOf(err)) != codes.NotFound {
		t.Errorf("a volume not staged here: %v, want NotFound", err)
	}
}
