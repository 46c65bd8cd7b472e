package volume

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDeviceNumber_ParseAndJSON(t *testing.T) {
	n, err := ParseDeviceNumber("259:3\n")
	if err != nil || n != (DeviceNumber{259, 3}) || n.String() != "259:3" {
		t.Fatalf("ParseDeviceNumber = %v, %v", n, err)
	}
	for _, bad := range []string{"", "259", "259:", ":3", "a:b", "259:3:1", "-1:3", "4294967296:0"} {
		if _, err := ParseDeviceNumber(bad); err == nil {
			t.Errorf("ParseDeviceNumber(%q) succeeded", bad)
		}
	}
	// A record keeps the number as "259:3" and omits an unknown one.
	b, err := json.Marshal(Record{VolumeID: "v", DevNum: n})
	if err != nil || !strings.Contains(string(b), `"devNum":"259:3"`) {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil || back.DevNum != n {
		t.Fatalf("unmarshal: %+v, %v", back, err)
	}
	if b, _ := json.Marshal(Record{VolumeID: "v"}); strings.Contains(string(b), "devNum") {
		t.Errorf("an unknown number is written: %s", b)
	}
}

func TestFindStagedDevice(t *testing.T) {
	fsRec := Record{VolumeID: "fs", AccessType: AccessMount, StagingPath: "/stage/fs", Device: "/dev/nvme0n2", DevNum: DeviceNumber{259, 3}}
	blkRec := Record{VolumeID: "blk", AccessType: AccessBlock, StagingPath: "/stage/blk", Device: "/dev/nvme0n2", DevNum: DeviceNumber{259, 3},
		Publications: []Publication{{TargetPath: "/pods/a/dev"}}}
	mounts := []Mount{
		{Path: "/", Source: "/dev/sda1", Number: DeviceNumber{8, 1}},
		{Path: "/stage/fs", Source: "/dev/nvme0n2", Number: DeviceNumber{259, 3}},
		{Path: "/stage/fs", Source: "/dev/nvme0n5", Number: DeviceNumber{259, 9}}, // stacked on top
	}
	noNode := func(string) (DeviceNumber, bool) { return DeviceNumber{}, false }
	for _, tc := range []struct {
		name   string
		rec    Record
		mounts []Mount
		rdev   func(string) (DeviceNumber, bool)
		want   StagedDevice
		ok     bool
	}{
		{"filesystem: the topmost mount wins over the record", fsRec, mounts, noNode,
			StagedDevice{BlockDevice{"nvme0n5", DeviceNumber{259, 9}}, "the staging mount at /stage/fs"}, true},
		{"filesystem: nothing mounted", fsRec, mounts[:1], noNode, StagedDevice{}, false},
		{"block: the node bound at a publication", blkRec, nil, func(p string) (DeviceNumber, bool) { return DeviceNumber{259, 1}, p == "/pods/a/dev" },
			StagedDevice{BlockDevice{"nvme0n2", DeviceNumber{259, 1}}, "the publication at /pods/a/dev"}, true},
		{"block: unpublished, the record's number", blkRec, nil, noNode,
			StagedDevice{BlockDevice{"nvme0n2", DeviceNumber{259, 3}}, "the record"}, true},
		{"block: a record without a number", Record{AccessType: AccessBlock, Device: "/dev/sdb"}, nil, noNode, StagedDevice{}, false},
	} {
		got, ok := FindStagedDevice(tc.rec, tc.mounts, tc.rdev)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %+v %t, want %+v %t", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestReplaced(t *testing.T) {
	rec := Record{VolumeID: "pv-2", AccessType: AccessMount, StagingPath: "/stage/pv-2"}
	staged := StagedDevice{Device: BlockDevice{"nvme0n2", DeviceNumber{259, 3}}, From: "the staging mount at /stage/pv-2"}
	if _, ok := Replaced(rec, staged, []BlockDevice{{"nvme0n2", DeviceNumber{259, 3}}}, false); ok {
		t.Error("the current device counts as replaced")
	}
	// Same number under another name (a map's /dev/mapper name, a node
	// name the kernel reused): the number decides.
	if _, ok := Replaced(rec, staged, []BlockDevice{{"dm-4", DeviceNumber{259, 3}}}, false); ok {
		t.Error("a device matched by number counts as replaced")
	}
	if _, ok := Replaced(rec, staged, nil, true); ok {
		t.Error("replaced with nothing to compare with")
	}
	// The same name with another number is another device.
	c, ok := Replaced(rec, staged, []BlockDevice{{"nvme0n2", DeviceNumber{259, 7}}}, true)
	if !ok {
		t.Fatal("a new device under the old name is not a replacement")
	}
	want := Condition{Status: Inaccessible, Reason: ReasonStagedDeviceReplaced}
	if diff := cmp.Diff(want, Condition{Status: c.Status, Reason: c.Reason}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, s := range []string{"the staging mount at /stage/pv-2", "nvme0n2 (259:3)", "which the kernel removed", "now nvme0n2 (259:7)", "restart the pods"} {
		if !strings.Contains(c.Message, s) {
			t.Errorf("message %q lacks %q", c.Message, s)
		}
	}
}
