package iscsi

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// The kernel's wwid and ParseVPD83 of the same device agree on every LUN
// of every lab capture.
func TestParseVPD83_AgreesWithTheKernelsWWIDOnEveryCapturedLUN(t *testing.T) {
	n := 0
	for _, name := range []string{"iscsi-healthy", "iscsi-session-failed", "iscsi-session-free", "iscsi-session-stuck"} {
		fx, err := sysfstest.LoadFixture(filepath.Join(fixtureDir, name+".sysfs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range fx.Entries {
			if e.Kind != sysfstest.KindFile || !strings.HasSuffix(e.Path, "/vpd_pg83") {
				continue
			}
			wwid, ok := fx.Lookup(strings.TrimSuffix(e.Path, "vpd_pg83") + "wwid")
			if !ok {
				t.Fatalf("%s: no wwid beside %s", name, e.Path)
			}
			got, err := ParseVPD83([]byte(e.Value))
			if want := strings.TrimSpace(wwid.Value); err != nil || got != want {
				t.Errorf("%s %s: ParseVPD83 = %q, %v; kernel wwid %q", name, e.Path, got, err, want)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d LUNs checked", n)
	}
}

func TestParseVPD83_Preferences(t *testing.T) {
	desig := func(assoc, typ byte, d ...byte) []byte {
		return append([]byte{0x01, assoc<<4 | typ, 0, byte(len(d))}, d...)
	}
	page := func(ds ...[]byte) []byte {
		var body []byte
		for _, d := range ds {
			body = append(body, d...)
		}
		return append([]byte{0, 0x83, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	naa8 := desig(0, desigNAA, 0x50, 1, 2, 3, 4, 5, 6, 7)
	eui8 := desig(0, desigEUI64, 0xaa, 1, 2, 3, 4, 5, 6, 7)
	t10 := desig(0, desigT10, []byte("LIO-ORG  disk\x01")...)
	portNAA := desig(1, desigNAA, 0x60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
	for _, tc := range []struct {
		name string
		page []byte
		want string
	}{
		{"NAA over a longer T10", page(naa8, t10), "naa.5001020304050607"},
		{"T10 alone, escaped", page(t10), `t10.LIO-ORG  disk\001`},
		{"NAA over an EUI-64 of the same length", page(eui8, naa8), "naa.5001020304050607"},
		{"EUI-64 over a T10", page(t10, eui8), "eui.aa01020304050607"},
		{"target-port designators are skipped", page(portNAA, eui8), "eui.aa01020304050607"},
		{"SCSI name string", page(desig(0, desigSCSIName, []byte("iqn.x:lun\x00\x00")...)), "iqn.x:lun"},
		{"NAA registered extended over EUI-64 16", page(desig(0, desigNAA, 0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
			desig(0, desigEUI64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)), "naa.600102030405060708090a0b0c0d0e0f"},
		{"a later designator of equal priority wins", page(naa8, desig(0, desigNAA, 0x5f, 0, 0, 0, 0, 0, 0, 1)), "naa.5f00000000000001"},
		{"NAA of an unknown format is not used", page(desig(0, desigNAA, 0x20, 0, 0, 0, 0, 0, 0, 1), t10), `t10.LIO-ORG  disk\001`},
	} {
		if got, err := ParseVPD83(tc.page); err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0x80, 0, 0}, {0, 0x83, 0, 9, 1}, page(portNAA), {0, 0x83, 0, 3, 1, 3, 0}, {0, 0x83, 0, 4, 1, 3, 0, 9}} {
		if got, err := ParseVPD83(bad); err == nil {
			t.Errorf("ParseVPD83(% x) = %q, want an error", bad, got)
		}
	}
}

// ParseVPD83 reads binary from the kernel: it never panics, and what it
// accepts has one of the wwid forms.
func FuzzParseVPD83(f *testing.F) {
	fx, err := sysfstest.LoadFixture(filepath.Join(fixtureDir, "iscsi-session-failed.sysfs"))
	if err != nil {
		f.Fatal(err)
	}
	if e, ok := fx.Lookup("devices/platform/host0/session1/target0:0:0/0:0:0:0/vpd_pg83"); ok {
		f.Add([]byte(e.Value))
	}
	f.Add([]byte{0, 0x83, 0, 12, 1, 3, 0, 8, 0x50, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{0, 0x83, 0, 0})
	f.Fuzz(func(t *testing.T, page []byte) {
		id, err := ParseVPD83(page)
		if err != nil {
			return
		}
		if id == "" {
			t.Fatal("accepted with an empty identifier")
		}
	})
}
