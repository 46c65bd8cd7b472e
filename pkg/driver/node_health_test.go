package driver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/driver"
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
	env.attacher.health = func(volume.Record) driver.Condition {
		return driver.Condition{Status: driver.Degraded, Reason: "PathsBelowExpected", Message: long}
	}
	vctx, _, err := volume.Parse(nvmeContext(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const volumes = 40
	for i := 0; i < volumes; i++ {
		rec := volume.Record{VolumeID: fmt.Sprintf("vol-%02d", i), Context: vctx, StagingPath: fmt.Sprintf("/staging/%02d", i), AccessType: volume.AccessBlock, Device: "/dev/nvme0n1"}
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
	if !strings.HasSuffix(m, fmt.Sprintf("; and %d more volumes", volumes-named)) {
		t.Errorf("storage health message names %d volumes and does not count the other %d: …%s", named, volumes-named, m[max(0, len(m)-60):])
	}
}
