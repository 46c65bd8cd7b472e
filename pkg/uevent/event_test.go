package uevent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// loopChange is a message exactly as a 6.18 kernel sent it when losetup
// attached a loop device, keys in the kernel's order.
const loopChange = "change@/devices/virtual/block/loop2\x00ACTION=change\x00DEVPATH=/devices/virtual/block/loop2\x00SUBSYSTEM=block\x00DISK_MEDIA_CHANGE=1\x00MAJOR=7\x00MINOR=2\x00DEVNAME=loop2\x00DEVTYPE=disk\x00DISKSEQ=459\x00SEQNUM=1548\x00"

func TestParse_KernelMessage(t *testing.T) {
	e, err := uevent.Parse([]byte(loopChange))
	if err != nil {
		t.Fatal(err)
	}
	want := uevent.Event{Seq: 1548, Action: uevent.Change, DevPath: "/devices/virtual/block/loop2", Subsystem: "block",
		Env: map[string]string{"ACTION": "change", "DEVPATH": "/devices/virtual/block/loop2", "SUBSYSTEM": "block",
			"DISK_MEDIA_CHANGE": "1", "MAJOR": "7", "MINOR": "2", "DEVNAME": "loop2", "DEVTYPE": "disk", "DISKSEQ": "459", "SEQNUM": "1548"}}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if e.Name() != "loop2" || e.String() != "change block loop2 (seq 1548)" {
		t.Errorf("Name %q, String %q", e.Name(), e.String())
	}
}

func TestParse_EncodeRoundTrips(t *testing.T) {
	e, err := uevent.Parse([]byte(loopChange))
	if err != nil {
		t.Fatal(err)
	}
	again, err := uevent.Parse(uevent.Encode(e))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(e, again, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Parse(Encode(e)) (-want +got):\n%s", diff)
	}
}

func TestParse_RefusesWhatTheKernelDoesNotSend(t *testing.T) {
	const ok = "add@/devices/x\x00ACTION=add\x00DEVPATH=/devices/x\x00SUBSYSTEM=nvme\x00SEQNUM=7\x00"
	if _, err := uevent.Parse([]byte(ok)); err != nil {
		t.Fatalf("the well-formed message: %v", err)
	}
	for _, tc := range []struct{ name, msg, want string }{
		{"empty", "", "empty message"},
		{"udev frame", "libudev\x00\xfe\xed\xca\xfe", "not a kernel message"},
		{"no header", "ACTION=add\x00DEVPATH=/x\x00SUBSYSTEM=a\x00SEQNUM=1\x00", "is not ACTION@DEVPATH"},
		{"no equals", "add@/x\x00ACTION=add\x00junk\x00", `field "junk" has no '='`},
		{"bad key", "add@/x\x00ACTION=add\x00BAD KEY=1\x00", `key "BAD KEY"`},
		{"empty key", "add@/x\x00=1\x00", `key ""`},
		{"duplicate", "add@/x\x00ACTION=add\x00ACTION=remove\x00", "ACTION given twice"},
		{"no seqnum", "add@/x\x00ACTION=add\x00DEVPATH=/x\x00SUBSYSTEM=a\x00", "SEQNUM is missing"},
		{"no subsystem", "add@/x\x00ACTION=add\x00DEVPATH=/x\x00SEQNUM=1\x00", "SUBSYSTEM is missing"},
		{"relative devpath", "add@x\x00ACTION=add\x00DEVPATH=x\x00SUBSYSTEM=a\x00SEQNUM=1\x00", "is not absolute"},
		{"header disagrees", "add@/x\x00ACTION=remove\x00DEVPATH=/x\x00SUBSYSTEM=a\x00SEQNUM=1\x00", "disagrees"},
		{"bad seqnum", "add@/x\x00ACTION=add\x00DEVPATH=/x\x00SUBSYSTEM=a\x00SEQNUM=-1\x00", "SEQNUM"},
		{"too large", "add@/x\x00" + strings.Repeat("A", uevent.MaxMessage), "larger than"},
		{"too many keys", "add@/x\x00" + manyKeys(uevent.MaxKeys+1), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := uevent.Parse([]byte(tc.msg))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, %v; want an error containing %q", e, err, tc.want)
			}
			if e.Env != nil || e.Action != "" {
				t.Errorf("Parse returned %+v with its error", e)
			}
		})
	}
	if _, err := uevent.Parse([]byte("libudev\x00x")); !errors.Is(err, uevent.ErrNotKernel) {
		t.Errorf("udev frame: %v, want ErrNotKernel", err)
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("K")
		for j := i; j > 0; j /= 26 {
			b.WriteByte(byte('A' + j%26))
		}
		b.WriteString("=1\x00")
	}
	return b.String()
}
