package nvme

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Address
	}{
		{"", Address{}},
		{"traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1", Address{Traddr: "127.0.0.1", Trsvcid: "4420", SrcAddr: "127.0.0.1"}},
		// A controller reconnecting has lost its socket: no src_addr.
		{"traddr=127.0.0.1,trsvcid=4421", Address{Traddr: "127.0.0.1", Trsvcid: "4421"}},
		{
			"traddr=fd00::2,trsvcid=4420,host_traddr=fd00::9,host_iface=eth1,src_addr=fd00::9",
			Address{Traddr: "fd00::2", Trsvcid: "4420", HostTraddr: "fd00::9", HostIface: "eth1", SrcAddr: "fd00::9"},
		},
		// FC addresses, and keys a newer kernel may add, pass through.
		{"traddr=nn-0x1000:pn-0x2000,host_traddr=nn-0x3:pn-0x4,future=1", Address{Traddr: "nn-0x1000:pn-0x2000", HostTraddr: "nn-0x3:pn-0x4"}},
		{"traddr=", Address{}},
	} {
		got, err := ParseAddress(tc.in)
		if err != nil {
			t.Errorf("ParseAddress(%q): %v", tc.in, err)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("ParseAddress(%q) (-want +got):\n%s", tc.in, d)
		}
	}
	for _, bad := range []string{"0000:01:00.0", "traddr=1,traddr=2", "=x", "traddr=1,,trsvcid=2", ","} {
		if a, err := ParseAddress(bad); err == nil {
			t.Errorf("ParseAddress(%q) = %+v, want an error", bad, a)
		}
	}
}

func TestEndpoint_String(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		want string
	}{
		{Endpoint{Transport: "tcp", Traddr: "10.0.0.2", Trsvcid: "4420"}, "tcp 10.0.0.2:4420"},
		{Endpoint{Transport: "tcp", Traddr: "fd00::2", Trsvcid: "4420", HostTraddr: "fd00::9", HostIface: "eth1"}, "tcp [fd00::2]:4420 host_traddr=fd00::9 host_iface=eth1"},
		{Endpoint{Transport: "fc", Traddr: "nn-0x1:pn-0x2"}, "fc nn-0x1:pn-0x2"},
		{Endpoint{Transport: "loop"}, "loop"},
	} {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for in, want := range map[string]Timeout{"off": {Off: true}, "600": {Seconds: 600}, "0": {}, "-1": {Seconds: -1}} {
		got, err := ParseTimeout(in)
		if err != nil || got != want {
			t.Errorf("ParseTimeout(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if err == nil && got.String() != in {
			t.Errorf("ParseTimeout(%q).String() = %q", in, got.String())
		}
	}
	for _, bad := range []string{"", "Off", " 1", "1.5", "99999999999"} {
		if _, err := ParseTimeout(bad); !errors.Is(err, errSyntax) {
			t.Errorf("ParseTimeout(%q) error = %v, want errSyntax", bad, err)
		}
	}
}

func TestNames(t *testing.T) {
	for name, want := range map[ControllerName]int{"nvme0": 0, "nvme12": 12, "nvme": -1, "nvme01": -1, "nvme0n1": -1, "nvme-subsys0": -1, "ng0": -1} {
		if got := name.Instance(); got != want {
			t.Errorf("ControllerName(%q).Instance() = %d, want %d", name, got, want)
		}
	}
	for name, want := range map[SubsystemName]int{"nvme-subsys0": 0, "nvme-subsys7": 7, "nvme-subsys": -1, "nvme7": -1} {
		if got := name.Instance(); got != want {
			t.Errorf("SubsystemName(%q).Instance() = %d, want %d", name, got, want)
		}
	}
	for _, tc := range []struct {
		in   string
		want diskName
		ok   bool
	}{
		{"nvme0n1", diskName{first: 0, ctrl: -1, head: 1}, true},
		{"nvme2c3n1", diskName{first: 2, ctrl: 3, head: 1}, true},
		{"nvme10c11n12", diskName{first: 10, ctrl: 11, head: 12}, true},
		{"nvme0", diskName{}, false},
		{"ng0n1", diskName{}, false},
		{"nvme0n1p1", diskName{}, false},
		{"nvme0cn1", diskName{}, false},
		{"nvme0c1c2n1", diskName{}, false},
		{"nvmen1", diskName{}, false},
	} {
		got, ok := parseDiskName(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseDiskName(%q) = %+v, %t; want %+v, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if d, _ := parseDiskName("nvme2c3n4"); d.headName() != "nvme2n4" {
		t.Errorf("headName of nvme2c3n4 = %q", d.headName())
	}
}
