package nvme

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"strconv"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/volume"
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

// FuzzConnectOptions: one validator per identifier. Every nvme-tcp volume
// context pkg/volume.Parse accepts yields, for each of its endpoints,
// fabrics options the encoder accepts, so a value the kernel's option
// string cannot carry is an InvalidArgument at parse time, never a connect
// that fails on every retry.
func FuzzConnectOptions(f *testing.F) {
	for _, s := range [][5]string{
		{"nqn.2014-08.com.example:sub1", "192.0.2.10:4420,[fd00::1]:4420", "", "", ""},
		{"nqn.2014-08.com.example:a=b", "192.0.2.10:4420", "", "", ""},
		{"nqn.2014-08.org.nvmexpress:uuid:0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b", "target.example:4420", "192.0.2.1", "eth0", dhchapKey},
		{"nqn.2014-08.com.example:x", "192.0.2.10:4420", "fd00::9", "e=th0", ""},
		{"nqn.2014-08.com.example:x", "192.0.2.10:4420", "", "eth\t0", "DHHC-1:00:a=b:"},
		{"nqn.2014-08.com.example:x\n", "a.example:1", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	host := fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555", ID: "11111111-2222-3333-4444-555555555555"}
	f.Fuzz(func(t *testing.T, nqn, endpoints, hostTraddr, hostIface, secret string) {
		vc := map[string]string{"transport": "nvme-tcp", "nqn": nqn, "endpoints": endpoints, "nsid": "1"}
		if hostTraddr != "" {
			vc["hostTraddr"] = hostTraddr
		}
		if hostIface != "" {
			vc["hostIface"] = hostIface
		}
		secrets := map[string]string{}
		if secret != "" {
			secrets["dhchapSecret"] = secret
		}
		c, s, err := volume.Parse(vc, secrets)
		if err != nil {
			return
		}
		for _, ep := range c.NVMe.Endpoints {
			if err := ConnectOptions(c.NVMe, ep, host, s).Check(); err != nil {
				t.Fatalf("Parse accepted %q, but the options of endpoint %s do not encode: %v", vc, ep, err)
			}
		}
	})
}

// dhchapKey is a well-formed DH-HMAC-CHAP key: 32 bytes and their CRC-32.
var dhchapKey = func() string {
	key := []byte(strings.Repeat("k", 32))
	raw := binary.LittleEndian.AppendUint32(key, crc32.ChecksumIEEE(key))
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(raw) + ":"
}()
