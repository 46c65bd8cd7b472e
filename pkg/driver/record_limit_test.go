package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/volume"
)

// worst is a string of n bytes that JSON spells as long as it can without
// a control character (which the door refuses in paths): U+2028, three
// bytes in UTF-8, six in JSON.
func worst(n int) string {
	s := strings.Repeat("\u2028", n/3)
	return s + strings.Repeat(`"`, n-len(s))
}

// biggestContext is a volume context of exactly 4096 bytes, keys and
// values together, that parses to the largest Context: every key set,
// MaxEndpoints endpoints, all but one of them optimized.
func biggestContext(t *testing.T) map[string]string {
	t.Helper()
	eps := make([]string, volume.MaxEndpoints)
	for i := range eps {
		eps[i] = fmt.Sprintf("10.0.%d.%d:4420", i/250, i%250+1)
	}
	vc := map[string]string{
		"transport": "nvme-tcp", "endpoints": strings.Join(eps, ","), "optimizedEndpoints": strings.Join(eps[1:], ","),
		"nsid": "4294967294", "nguid": "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0e", "uuid": "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b",
		"hostTraddr": "fd00:1:2:3:4:5:6:7", "hostIface": "enp1s0f1np1abcd", "ctrlLossTmo": "31536000", "reconnectDelay": "3600",
		"fastIOFailTmo": "31536000", "keepAliveTmo": "3600", "nrIOQueues": "1024",
	}
	size := 0
	for k, v := range vc {
		size += len(k) + len(v)
	}
	prefix := "nqn.2014-08.com.example:"
	room := maxMapBytes - size - len("nqn")
	if room < len(prefix)+1 {
		t.Fatalf("no room for the nqn: %d bytes", room)
	}
	vc["nqn"] = prefix + strings.Repeat("n", min(room, 223)-len(prefix))
	if pad := maxMapBytes - (size + len("nqn") + len(vc["nqn"])); pad > 0 {
		key := volume.IgnoredKeyPrefix + "pad"
		vc[key] = strings.Repeat("p", pad-len(key))
	}
	return vc
}

// TestRecord_BiggestAcceptedRequestRoundTrips: the largest record the
// door and the parser admit — a 128-byte volume ID, 4095-byte paths, a
// 4 KiB context with MaxEndpoints endpoints, 4 KiB of mount flags and
// MaxPublications publications, every string chosen for the longest JSON
// — is written by Put and read back equal by Get. No request can produce a
// record the store cannot read.
func TestRecord_BiggestAcceptedRequestRoundTrips(t *testing.T) {
	d := &Driver{}
	vc := biggestContext(t)
	flags := make([]string, maxMountFlagsBytes)
	for i := range flags {
		flags[i] = `"`
	}
	stage := &csi.NodeStageVolumeRequest{
		VolumeId:          worst(maxStringBytes),
		StagingTargetPath: "/" + worst(maxPathBytes-1),
		VolumeContext:     vc,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: flags}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		},
	}
	if err := d.checkRequest(stage.ProtoReflect(), ""); err != nil {
		t.Fatalf("the door refuses the biggest stage: %v", err)
	}
	c, _, err := volume.ParseWithPublish(stage.GetVolumeContext(), nil, nil)
	if err != nil {
		t.Fatalf("the parser refuses the biggest context: %v", err)
	}
	// The longest state and the largest device number the kernel hands
	// out (12-bit major, 20-bit minor).
	rec := volume.Record{
		VolumeID: stage.GetVolumeId(), State: volume.StateDetaching, StateSince: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Context: c, StagingPath: stage.GetStagingTargetPath(),
		AccessType: volume.AccessMount, FSType: "ext4", MountFlags: flags, Device: "/dev/nvme0n1", DevNum: volume.DeviceNumber{Major: 4095, Minor: 1048575},
		StagedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
	for i := range volume.MaxPublications {
		p := fmt.Sprintf("/%03d", i)
		target := p + worst(maxPathBytes-len(p))
		pub := &csi.NodePublishVolumeRequest{VolumeId: rec.VolumeID, StagingTargetPath: rec.StagingPath, TargetPath: target}
		if err := d.checkRequest(pub.ProtoReflect(), ""); err != nil {
			t.Fatalf("the door refuses publication %d: %v", i, err)
		}
		rec.Publications = append(rec.Publications, volume.Publication{TargetPath: target, ReadOnly: i%2 == 0})
	}

	store, err := volume.NewStore(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(rec); err != nil {
		t.Fatalf("Put of the biggest record: %v", err)
	}
	got, err := store.Get(rec.VolumeID)
	if err != nil {
		t.Fatalf("Get of the biggest record: %v", err)
	}
	rec.Version = volume.RecordVersion
	if diff := cmp.Diff(rec, got); diff != "" {
		t.Errorf("record (-put +got):\n%.2000s", diff)
	}
	recs, err := store.List()
	if err != nil || len(recs) != 1 {
		t.Errorf("List = %d records, %v", len(recs), err)
	}
	if files, _ := filepath.Glob(filepath.Join(store.Dir(), "volumes", "vol-*.json")); len(files) == 1 {
		if fi, err := os.Stat(files[0]); err == nil {
			t.Logf("biggest record: %d bytes", fi.Size())
		}
	}
}
