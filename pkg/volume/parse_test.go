package volume

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// drop marks a key withKeys removes from the base map.
const drop = "\x00drop"

// withKeys returns a copy of base with the key/value pairs applied.
func withKeys(base map[string]string, kv ...string) map[string]string {
	m := maps.Clone(base)
	if m == nil {
		m = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == drop {
			delete(m, kv[i])
			continue
		}
		m[kv[i]] = kv[i+1]
	}
	return m
}

var (
	nvmeBase = map[string]string{
		"transport": "nvme-tcp",
		"nqn":       "nqn.2014-08.com.example:sub1",
		"endpoints": "192.0.2.10:4420,192.0.2.11:4420",
		"nsid":      "1",
	}
	iscsiBase = map[string]string{
		"transport": "iscsi",
		"iqn":       "iqn.2001-04.com.example:storage.disk1",
		"portals":   "192.0.2.20:3260,192.0.2.21:3260",
		"lun":       "3",
	}
)

// nvmeWant is the Context Parse returns for nvmeBase, changed by mod.
func nvmeWant(mod func(n *NVMeTCP)) Context {
	n := &NVMeTCP{
		NQN:       "nqn.2014-08.com.example:sub1",
		Endpoints: []Endpoint{{"192.0.2.10", 4420}, {"192.0.2.11", 4420}},
		NSID:      1,
	}
	if mod != nil {
		mod(n)
	}
	return Context{Transport: TransportNVMeTCP, NVMe: n}
}

// iscsiWant is the Context Parse returns for iscsiBase, changed by mod.
func iscsiWant(mod func(s *ISCSI)) Context {
	s := &ISCSI{
		IQN:     "iqn.2001-04.com.example:storage.disk1",
		Portals: []Endpoint{{"192.0.2.20", 3260}, {"192.0.2.21", 3260}},
		LUN:     3,
	}
	if mod != nil {
		mod(s)
	}
	return Context{Transport: TransportISCSI, ISCSI: s}
}

func intp(i int) *int { return &i }

// dhchapKey builds a well-formed DH-HMAC-CHAP key: hash id, keyLen bytes of
// key material derived from seed, and the CRC-32 the kernel checks.
func dhchapKey(hashID string, keyLen int, seed byte) string {
	key := make([]byte, keyLen)
	for i := range key {
		key[i] = byte(i*7) ^ seed
	}
	raw := binary.LittleEndian.AppendUint32(key, crc32.ChecksumIEEE(key))
	return "DHHC-1:" + hashID + ":" + base64.StdEncoding.EncodeToString(raw) + ":"
}

// badCRCKey is dhchapKey with one key byte flipped after the checksum.
func badCRCKey() string {
	key := make([]byte, 32)
	raw := binary.LittleEndian.AppendUint32(key, crc32.ChecksumIEEE(key))
	raw[0] ^= 1
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(raw) + ":"
}

var (
	hostKey = dhchapKey("00", 32, 0x11)
	ctrlKey = dhchapKey("01", 32, 0x22)
)

// validCase is a volume context (and secrets) Parse accepts, with the exact
// normalized result.
type validCase struct {
	name        string
	vc, secrets map[string]string
	want        Context
	wantSecrets Secrets
}

var validCases = []validCase{
	{
		name: "nvme minimal",
		vc:   nvmeBase,
		want: nvmeWant(nil),
	},
	{
		name: "nvme every key, normalized",
		vc: withKeys(nvmeBase,
			"endpoints", " [FD00:0:0::0001]:4420 , 192.0.2.12:4420,192.0.2.10:04420",
			"optimizedEndpoints", "192.0.2.10:4420, [fd00::1]:4420",
			"nsid", "4294967294",
			"nguid", "6E0B0C8E-1F2A-4B3C-8D4E-5F6A7B8C9D0E",
			"uuid", "0F9C3A52-3D2B-4C6E-9A1B-2C3D4E5F6A7B",
			"hostTraddr", "FD00::0100",
			"hostIface", "ens1f0.100",
			"ctrlLossTmo", "-1",
			"reconnectDelay", "5",
			"fastIOFailTmo", "0",
			"keepAliveTmo", "10",
			"nrIOQueues", "8",
			"csi.storage.k8s.io/pod.name", "web-0",
			"csi.storage.k8s.io/ephemeral", "false",
		),
		secrets: map[string]string{
			"dhchapSecret":                 hostKey,
			"dhchapCtrlSecret":             ctrlKey,
			"csi.storage.k8s.io/something": "ignored",
		},
		want: nvmeWant(func(n *NVMeTCP) {
			n.Endpoints = []Endpoint{{"fd00::1", 4420}, {"192.0.2.12", 4420}, {"192.0.2.10", 4420}}
			// In the order of endpoints, not of optimizedEndpoints.
			n.OptimizedEndpoints = []Endpoint{{"fd00::1", 4420}, {"192.0.2.10", 4420}}
			n.NSID = 4294967294
			n.NGUID = "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0e"
			n.UUID = "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b"
			n.HostTraddr = "fd00::100"
			n.HostIface = "ens1f0.100"
			n.CtrlLossTmo = intp(-1)
			n.ReconnectDelay = intp(5)
			n.FastIOFailTmo = intp(0)
			n.KeepAliveTmo = intp(10)
			n.NrIOQueues = intp(8)
		}),
		wantSecrets: Secrets{DHCHAPSecret: hostKey, DHCHAPCtrlSecret: ctrlKey},
	},
	{
		name: "nvme optimizedEndpoints naming every endpoint is the same as none",
		vc:   withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.11:4420,192.0.2.10:4420"),
		want: nvmeWant(nil),
	},
	{
		name: "nvme UUID-form NQN, identity by nguid only",
		vc: withKeys(nvmeBase,
			"nqn", "nqn.2014-08.org.nvmexpress:uuid:9A1B2C3D-4E5F-4A6B-8C7D-0E1F2A3B4C5D",
			"nsid", drop,
			"nguid", "00624A9370B5A5D6FA6A4F8F00011AE2"),
		want: nvmeWant(func(n *NVMeTCP) {
			n.NQN = "nqn.2014-08.org.nvmexpress:uuid:9A1B2C3D-4E5F-4A6B-8C7D-0E1F2A3B4C5D"
			n.NSID = 0
			n.NGUID = "00624a9370b5a5d6fa6a4f8f00011ae2"
		}),
	},
	{
		name: "nvme NQN without ':' part, identity by uuid only",
		vc:   withKeys(nvmeBase, "nqn", "nqn.2016-06.io.spdk", "nsid", drop, "uuid", "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b"),
		want: nvmeWant(func(n *NVMeTCP) {
			n.NQN = "nqn.2016-06.io.spdk"
			n.NSID = 0
			n.UUID = "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b"
		}),
	},
	{
		name: "nvme IPv4-mapped IPv6 endpoint becomes IPv4",
		vc:   withKeys(nvmeBase, "endpoints", "[::ffff:192.0.2.30]:4420,192.0.2.31:8009"),
		want: nvmeWant(func(n *NVMeTCP) {
			n.Endpoints = []Endpoint{{"192.0.2.30", 4420}, {"192.0.2.31", 8009}}
		}),
	},
	{
		name:        "nvme unidirectional DH-HMAC-CHAP with a SHA-512 sized key and no trailing colon",
		vc:          nvmeBase,
		secrets:     map[string]string{"dhchapSecret": strings.TrimSuffix(dhchapKey("03", 64, 0x33), ":")},
		want:        nvmeWant(nil),
		wantSecrets: Secrets{DHCHAPSecret: strings.TrimSuffix(dhchapKey("03", 64, 0x33), ":")},
	},
	{
		name: "iscsi minimal with default ports",
		vc:   withKeys(iscsiBase, "portals", "192.0.2.20,192.0.2.21"),
		want: iscsiWant(nil),
	},
	{
		name: "iscsi every key, normalized",
		vc: withKeys(iscsiBase,
			"iqn", "iqn.2003-01.org.Linux-iSCSI.host:SN.0123ABCD",
			"portals", "[FD00::20]:3261, 192.0.2.21 ,fd00::22,Target.Example.com",
			"lun", "16383",
			"replacementTimeout", "0",
			"csi.storage.k8s.io/pv/name", "pv-1",
		),
		secrets: map[string]string{
			"chapUsername":   "initiator-user",
			"chapPassword":   "initiator-secret-1",
			"chapUsernameIn": "target-user",
			"chapPasswordIn": "target secret with spaces",
		},
		want: iscsiWant(func(s *ISCSI) {
			s.IQN = "iqn.2003-01.org.Linux-iSCSI.host:SN.0123ABCD" // case kept
			s.Portals = []Endpoint{{"fd00::20", 3261}, {"192.0.2.21", 3260}, {"fd00::22", 3260}, {"target.example.com", 3260}}
			s.LUN = 16383
			s.ReplacementTimeout = intp(0)
		}),
		wantSecrets: Secrets{
			CHAPUsername: "initiator-user", CHAPPassword: "initiator-secret-1",
			CHAPUsernameIn: "target-user", CHAPPasswordIn: "target secret with spaces",
		},
	},
	{
		name: "iscsi eui name, lun 0",
		vc:   withKeys(iscsiBase, "iqn", "eui.02004567A425678D", "lun", "0"),
		want: iscsiWant(func(s *ISCSI) { s.IQN = "eui.02004567A425678D"; s.LUN = 0 }),
	},
	{
		name: "iscsi naa 32 digits",
		vc:   withKeys(iscsiBase, "iqn", "naa.52004567BA64678D0123456789ABCDEF"),
		want: iscsiWant(func(s *ISCSI) { s.IQN = "naa.52004567BA64678D0123456789ABCDEF" }),
	},
	{
		name: "iscsi naa 16 digits",
		vc:   withKeys(iscsiBase, "iqn", "naa.52004567BA64678D"),
		want: iscsiWant(func(s *ISCSI) { s.IQN = "naa.52004567BA64678D" }),
	},
	{
		name:        "iscsi one-way CHAP only",
		vc:          iscsiBase,
		secrets:     map[string]string{"chapUsername": "u", "chapPassword": "p"},
		want:        iscsiWant(nil),
		wantSecrets: Secrets{CHAPUsername: "u", CHAPPassword: "p"},
	},
}

func TestParse_Valid(t *testing.T) {
	for _, tc := range validCases {
		t.Run(tc.name, func(t *testing.T) {
			got, gotSecrets, err := Parse(tc.vc, tc.secrets)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Context (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSecrets, gotSecrets); diff != "" {
				t.Errorf("Secrets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParse_NormalizedFormsCompareEqual is the property the driver relies
// on: two spellings of one volume parse to equal contexts.
func TestParse_NormalizedFormsCompareEqual(t *testing.T) {
	pairs := []struct {
		name string
		a, b map[string]string
	}{
		{"IPv6 spelling and spaces",
			withKeys(nvmeBase, "endpoints", "[fd00::1]:4420,[fd00::2]:4420"),
			withKeys(nvmeBase, "endpoints", " [FD00:0::1]:4420 ,[fd00:0000::0002]:04420")},
		{"host name case",
			withKeys(iscsiBase, "portals", "a.example.com"),
			withKeys(iscsiBase, "portals", "A.Example.COM:3260")},
		{"nguid dashes and case",
			withKeys(nvmeBase, "nguid", "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0e"),
			withKeys(nvmeBase, "nguid", "6E0B0C8E-1F2A-4B3C-8D4E-5F6A7B8C9D0E")},
		{"optimized order and full set",
			withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.10:4420,192.0.2.11:4420"),
			nvmeBase},
		{"iscsi default port spelled out",
			withKeys(iscsiBase, "portals", "192.0.2.20,192.0.2.21"),
			withKeys(iscsiBase, "portals", "192.0.2.20:3260, 192.0.2.21:3260")},
		{"ignored kubelet keys",
			withKeys(iscsiBase, "csi.storage.k8s.io/pod.uid", "1234"),
			iscsiBase},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			a, _, err := Parse(p.a, nil)
			if err != nil {
				t.Fatalf("Parse(a): %v", err)
			}
			b, _, err := Parse(p.b, nil)
			if err != nil {
				t.Fatalf("Parse(b): %v", err)
			}
			if diff := cmp.Diff(a, b); diff != "" {
				t.Errorf("contexts differ (-a +b):\n%s", diff)
			}
			if !a.Equal(b) {
				t.Error("Equal = false, want true")
			}
		})
	}
}

// TestParse_EveryDocumentedKeyIsValidated proves that the parser reads the
// value of every key in the table: a control character is invalid for all
// of them, so each must be reported under its own key. A key listed in Keys
// but forgotten by the parser would be accepted and fail here.
func TestParse_EveryDocumentedKeyIsValidated(t *testing.T) {
	for _, d := range Keys() {
		t.Run(d.Key, func(t *testing.T) {
			transports := []Transport{d.Transport}
			if d.Transport == anyTransport {
				transports = Transports
			}
			for _, tr := range transports {
				vc, secrets := nvmeBase, map[string]string(nil)
				if tr == TransportISCSI {
					vc = iscsiBase
				}
				if d.Secret {
					// Complete pairs, so the error can only come from the bad value.
					secrets = map[string]string{"chapUsername": "u", "chapPassword": "p", "chapUsernameIn": "ui", "chapPasswordIn": "pi"}
					if tr == TransportNVMeTCP {
						secrets = map[string]string{"dhchapSecret": hostKey}
					}
					secrets[d.Key] = "\x01"
				} else {
					vc = withKeys(vc, d.Key, "\x01")
				}
				_, _, err := Parse(vc, secrets)
				var fe *FieldError
				if !errors.As(err, &fe) {
					t.Fatalf("transport %s: Parse error = %v, want *FieldError", tr, err)
				}
				if fe.Key != d.Key || fe.Secret != d.Secret {
					t.Errorf("transport %s: FieldError{Key: %q, Secret: %t}, want {%q, %t}: %v", tr, fe.Key, fe.Secret, d.Key, d.Secret, err)
				}
			}
		})
	}
}

// TestParse_Deterministic runs an input with several bad keys many times:
// map iteration order changes between runs, the reported error must not.
func TestParse_Deterministic(t *testing.T) {
	vc := withKeys(nvmeBase, "zzz", "1", "aaa", "2", "mmm", "3", "iqn", "x")
	_, _, first := Parse(vc, nil)
	if first == nil {
		t.Fatal("Parse succeeded, want an error")
	}
	var fe *FieldError
	if !errors.As(first, &fe) || fe.Key != "aaa" {
		t.Fatalf("error = %v, want the first key in sorted order (aaa)", first)
	}
	for range 50 {
		if _, _, err := Parse(vc, nil); err == nil || err.Error() != first.Error() {
			t.Fatalf("error changed between runs: %v, then %v", first, err)
		}
	}
}
