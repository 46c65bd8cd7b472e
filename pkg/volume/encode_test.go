package volume

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEncode_Canonical(t *testing.T) {
	tests := []struct {
		name string
		vc   map[string]string
		want map[string]string
	}{
		{
			name: "nvme, normalized and without ignored keys",
			vc: withKeys(nvmeBase,
				"endpoints", " [FD00::1]:4420, [::ffff:192.0.2.10]:4420",
				"optimizedEndpoints", "192.0.2.10:4420",
				"nguid", "6E0B0C8E-1F2A-4B3C-8D4E-5F6A7B8C9D0E",
				"ctrlLossTmo", "-1",
				"nrIOQueues", "04",
				"csi.storage.k8s.io/pod.name", "web-0"),
			want: map[string]string{
				"transport":          "nvme-tcp",
				"nqn":                "nqn.2014-08.com.example:sub1",
				"endpoints":          "[fd00::1]:4420,192.0.2.10:4420",
				"optimizedEndpoints": "192.0.2.10:4420",
				"nsid":               "1",
				"nguid":              "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0e",
				"ctrlLossTmo":        "-1",
				"nrIOQueues":         "4",
			},
		},
		{
			name: "nvme, optimizedEndpoints naming every endpoint disappears",
			vc:   withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.11:4420,192.0.2.10:4420", "fastIOFailTmo", "0"),
			want: map[string]string{
				"transport":     "nvme-tcp",
				"nqn":           "nqn.2014-08.com.example:sub1",
				"endpoints":     "192.0.2.10:4420,192.0.2.11:4420",
				"nsid":          "1",
				"fastIOFailTmo": "0",
			},
		},
		{
			name: "iscsi, default ports written out",
			vc:   withKeys(iscsiBase, "portals", "192.0.2.20, fd00::20", "lun", "0", "replacementTimeout", "15"),
			want: map[string]string{
				"transport":          "iscsi",
				"iqn":                "iqn.2001-04.com.example:storage.disk1",
				"portals":            "192.0.2.20:3260,[fd00::20]:3260",
				"lun":                "0",
				"replacementTimeout": "15",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := Parse(tc.vc, nil)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, c.Encode()); diff != "" {
				t.Errorf("Encode (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEncode_RoundTripsEveryValidCase checks Parse(Encode(c)) == c over the
// whole valid table; FuzzParse checks the same on generated inputs.
func TestEncode_RoundTripsEveryValidCase(t *testing.T) {
	for _, tc := range validCases {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := Parse(tc.vc, tc.secrets)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			again, _, err := Parse(c.Encode(), nil)
			if err != nil {
				t.Fatalf("Parse(Encode()): %v", err)
			}
			if diff := cmp.Diff(c, again); diff != "" {
				t.Errorf("round trip changed the context (-first +second):\n%s", diff)
			}
		})
	}
}

func TestEqual(t *testing.T) {
	parse := func(vc map[string]string) Context {
		t.Helper()
		c, _, err := Parse(vc, nil)
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		return c
	}
	viaJSON := func(c Context) Context {
		t.Helper()
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var out Context
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	full := parse(withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.10:4420", "ctrlLossTmo", "30", "uuid", "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b"))

	tests := []struct {
		name string
		a, b Context
		want bool
	}{
		{"same input", parse(nvmeBase), parse(nvmeBase), true},
		{"after a JSON round trip (record on disk)", full, viaJSON(full), true},
		{"nil and empty optimized lists", nvmeWant(nil), nvmeWant(func(n *NVMeTCP) { n.OptimizedEndpoints = []Endpoint{} }), true},
		{"tunables compare by value, not pointer", nvmeWant(func(n *NVMeTCP) { n.CtrlLossTmo = intp(5) }), nvmeWant(func(n *NVMeTCP) { n.CtrlLossTmo = intp(5) }), true},
		{"absent tunable is not the kernel default", parse(nvmeBase), parse(withKeys(nvmeBase, "ctrlLossTmo", "600")), false},
		{"endpoint order matters", parse(nvmeBase), parse(withKeys(nvmeBase, "endpoints", "192.0.2.11:4420,192.0.2.10:4420")), false},
		{"different transport", parse(nvmeBase), parse(iscsiBase), false},
		{"zero values", Context{}, Context{}, true},
		{"nil versus set sub-struct", Context{Transport: TransportISCSI}, iscsiWant(nil), false},
		{"iscsi lun", parse(iscsiBase), parse(withKeys(iscsiBase, "lun", "4")), false},
		{"iscsi replacementTimeout", parse(iscsiBase), parse(withKeys(iscsiBase, "replacementTimeout", "10")), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.a.Equal(tc.b); got != tc.want {
				t.Errorf("a.Equal(b) = %t, want %t", got, tc.want)
			}
			if got := tc.b.Equal(tc.a); got != tc.want {
				t.Errorf("b.Equal(a) = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestEqual_SeesEveryField changes each field of NVMeTCP and ISCSI in turn
// and expects Equal to notice. It fails when a field is added to either
// struct without being added to Equal.
func TestEqual_SeesEveryField(t *testing.T) {
	nvme := nvmeWant(func(n *NVMeTCP) {
		n.OptimizedEndpoints = []Endpoint{{"192.0.2.10", 4420}}
		n.NGUID = "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0e"
		n.UUID = "0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7b"
		n.HostTraddr = "192.0.2.100"
		n.HostIface = "eth1"
		n.CtrlLossTmo, n.ReconnectDelay, n.FastIOFailTmo, n.KeepAliveTmo, n.NrIOQueues = intp(1), intp(2), intp(3), intp(4), intp(5)
	})
	iscsi := iscsiWant(func(s *ISCSI) { s.ReplacementTimeout = intp(7) })

	for _, base := range []Context{nvme, iscsi} {
		sub := reflect.ValueOf(base.NVMe)
		if base.ISCSI != nil {
			sub = reflect.ValueOf(base.ISCSI)
		}
		typ := sub.Elem().Type()
		for i := range typ.NumField() {
			t.Run(typ.Name()+"."+typ.Field(i).Name, func(t *testing.T) {
				// A fresh deep copy via JSON, with one field changed.
				changed := roundTripJSON(t, base)
				target := reflect.ValueOf(changed.NVMe)
				if changed.ISCSI != nil {
					target = reflect.ValueOf(changed.ISCSI)
				}
				perturb(t, target.Elem().Field(i))
				if base.Equal(changed) {
					t.Errorf("Equal ignores a change of %s", typ.Field(i).Name)
				}
			})
		}
	}
}

func roundTripJSON(t *testing.T, c Context) Context {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out Context
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// perturb changes a field to a different value of the same type.
func perturb(t *testing.T, f reflect.Value) {
	t.Helper()
	switch f.Kind() {
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Int:
		f.SetInt(f.Int() + 1)
	case reflect.Uint32:
		f.SetUint(f.Uint() + 1)
	case reflect.Pointer:
		if f.Type().Elem().Kind() != reflect.Int {
			t.Fatalf("perturb: unsupported pointer type %s", f.Type())
		}
		n := int(f.Elem().Int()) + 1
		f.Set(reflect.ValueOf(&n))
	case reflect.Slice:
		f.Set(reflect.Append(f, reflect.ValueOf(Endpoint{"192.0.2.99", 1})))
	default:
		t.Fatalf("perturb: unsupported kind %s; extend perturb and Equal", f.Kind())
	}
}
