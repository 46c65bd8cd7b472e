package nvme

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseAddress: the address parser never panics, and what it accepts
// is consistent with its input.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{
		"traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1",
		"traddr=fd00::2,trsvcid=4420,host_traddr=fd00::9,host_iface=eth1",
		"", ",", "=", "traddr=a,traddr=b", "0000:01:00.0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddress(s)
		if err != nil {
			return
		}
		for _, v := range []string{a.Traddr, a.Trsvcid, a.HostTraddr, a.HostIface, a.SrcAddr} {
			if strings.Contains(v, ",") || (v != "" && !strings.Contains(s, v)) {
				t.Fatalf("ParseAddress(%q) = %+v: field %q not taken from the input", s, a, v)
			}
		}
		_ = Endpoint{Transport: "tcp", Traddr: a.Traddr, Trsvcid: a.Trsvcid, HostTraddr: a.HostTraddr}.String()
	})
}

// FuzzNumericAttrs: every parser of a numeric or named sysfs attribute
// never panics and round-trips what it accepts.
func FuzzNumericAttrs(f *testing.F) {
	for _, s := range []string{"0", "1", "600", "off", "-1", "18446744073709551615", "4294967296", "nvme0c1n2", "nvme-subsys3", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if tm, err := ParseTimeout(s); err == nil && tm.Off != (s == "off") {
			t.Fatalf("ParseTimeout(%q) = %+v", s, tm)
		}
		for _, bits := range []int{16, 32, 64} {
			if n, err := parseUint(s, bits); err == nil && bits < 64 && n>>bits != 0 {
				t.Fatalf("parseUint(%q, %d) = %d overflows", s, bits, n)
			}
		}
		_, _ = parseInt(s)
		if d, ok := parseDiskName(s); ok && (d.first < 0 || d.head < 0 || !strings.HasPrefix(s, "nvme")) {
			t.Fatalf("parseDiskName(%q) = %+v", s, d)
		}
		if n := ControllerName(s).Instance(); n >= 0 && string(ControllerName("nvme"+strconv.Itoa(n))) != s {
			t.Fatalf("ControllerName(%q).Instance() = %d does not round-trip", s, n)
		}
		_ = SubsystemName(s).Instance()
	})
}
