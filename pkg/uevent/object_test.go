package uevent_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/uevent"
)

func TestObjects_NamesEveryObjectOfThePath(t *testing.T) {
	o := func(k uevent.Kind, n string) uevent.Object { return uevent.Object{Kind: k, Name: n} }
	for _, tc := range []struct {
		subsystem, devpath string
		want               []uevent.Object
		relevant           bool
	}{
		{"nvme", "/devices/virtual/nvme-fabrics/ctl/nvme3", []uevent.Object{o(uevent.NVMeController, "nvme3")}, true},
		{"block", "/devices/virtual/nvme-fabrics/ctl/nvme3/nvme0c3n1", []uevent.Object{o(uevent.NVMeLeg, "nvme0c3n1"), o(uevent.NVMeController, "nvme3")}, true},
		{"nvme-subsystem", "/devices/virtual/nvme-subsystem/nvme-subsys0", []uevent.Object{o(uevent.NVMeSubsystem, "nvme-subsys0")}, true},
		{"block", "/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1", []uevent.Object{o(uevent.Block, "nvme0n1"), o(uevent.NVMeSubsystem, "nvme-subsys0")}, true},
		{"nvme-generic", "/devices/virtual/nvme-subsystem/nvme-subsys0/ng0n1", []uevent.Object{o(uevent.NVMeSubsystem, "nvme-subsys0")}, false},
		{"hwmon", "/devices/virtual/nvme-fabrics/ctl/nvme0/hwmon0", []uevent.Object{o(uevent.NVMeController, "nvme0")}, false},
		{"iscsi_session", "/devices/platform/host2/session1/iscsi_session/session1", []uevent.Object{o(uevent.ISCSISession, "session1"), o(uevent.SCSIHost, "host2")}, true},
		{"iscsi_connection", "/devices/platform/host2/session1/connection1:0/iscsi_connection/connection1:0",
			[]uevent.Object{o(uevent.ISCSIConnection, "connection1:0"), o(uevent.ISCSISession, "session1"), o(uevent.SCSIHost, "host2")}, true},
		{"scsi", "/devices/platform/host2/session1/target2:0:0/2:0:0:1",
			[]uevent.Object{o(uevent.SCSIDevice, "2:0:0:1"), o(uevent.ISCSISession, "session1"), o(uevent.SCSIHost, "host2")}, true},
		{"block", "/devices/platform/host2/session1/target2:0:0/2:0:0:1/block/sdc",
			[]uevent.Object{o(uevent.Block, "sdc"), o(uevent.SCSIDevice, "2:0:0:1"), o(uevent.ISCSISession, "session1"), o(uevent.SCSIHost, "host2")}, true},
		{"block", "/devices/virtual/block/dm-1", []uevent.Object{o(uevent.Block, "dm-1")}, true},
		{"block", "/devices/virtual/block/loop0", []uevent.Object{o(uevent.Block, "loop0")}, false},
		{"net", "/devices/virtual/net/lo", nil, false},
		{"module", "/module/nvme_tcp", nil, false},
	} {
		e := ev(1, uevent.Add, tc.devpath, tc.subsystem)
		if tc.subsystem == "scsi" {
			e.Env["DEVTYPE"] = "scsi_device"
		}
		if diff := cmp.Diff(tc.want, uevent.Objects(e)); diff != "" {
			t.Errorf("Objects(%s) (-want +got):\n%s", tc.devpath, diff)
		}
		if got := uevent.Relevant(e); got != tc.relevant {
			t.Errorf("Relevant(%s %s) = %v, want %v", tc.subsystem, tc.devpath, got, tc.relevant)
		}
	}
}

func TestObject_Session(t *testing.T) {
	for o, want := range map[uevent.Object]string{
		{Kind: uevent.ISCSISession, Name: "session4"}:         "session4",
		{Kind: uevent.ISCSIConnection, Name: "connection4:0"}: "session4",
		{Kind: uevent.NVMeController, Name: "nvme4"}:          "",
	} {
		if got := o.Session(); got != want {
			t.Errorf("%v.Session() = %q, want %q", o, got, want)
		}
	}
}
