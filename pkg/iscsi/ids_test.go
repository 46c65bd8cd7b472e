package iscsi

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseNames(t *testing.T) {
	if id, err := ParseSessionID("session42"); err != nil || id != 42 || id.String() != "session42" {
		t.Errorf("session42: %v %v", id, err)
	}
	if c, err := ParseConnectionID("connection4:0"); err != nil || c != (ConnectionID{Session: 4}) || c.String() != "connection4:0" {
		t.Errorf("connection4:0: %v %v", c, err)
	}
	if h, err := ParseHostID("host10"); err != nil || h != 10 || h.String() != "host10" {
		t.Errorf("host10: %v %v", h, err)
	}
	a, err := ParseSCSIAddress("2:0:1:16383")
	if err != nil || a != (SCSIAddress{Host: 2, Target: 1, LUN: 16383}) || a.String() != "2:0:1:16383" || a.ScanArgs() != "0 1 16383" {
		t.Errorf("2:0:1:16383: %+v %v", a, err)
	}
	for _, bad := range []string{"", "session", "session-1", "session01", "session 1", "sessionx", "session1234567890"} {
		if _, err := ParseSessionID(bad); err == nil {
			t.Errorf("ParseSessionID(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"connection4", "connection:0", "connection4:", "conn4:0", "connection4:0:1"} {
		if _, err := ParseConnectionID(bad); err == nil {
			t.Errorf("ParseConnectionID(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"1:2:3", "1:2:3:4:5", "a:0:0:0", "1:0:0:-1", "power", "subsystem"} {
		if _, err := ParseSCSIAddress(bad); err == nil {
			t.Errorf("ParseSCSIAddress(%q) accepted", bad)
		}
	}
	if h, c, tg, err := parseTargetDir("target3:0:2"); err != nil || h != 3 || c != 0 || tg != 2 {
		t.Errorf("target3:0:2: %v %v %v %v", h, c, tg, err)
	}
}

// Whatever the name parsers accept prints back to the same name.
func FuzzParseSCSIAddress(f *testing.F) {
	for _, s := range []string{"0:0:0:0", "2:0:1:16383", "1:2:3", "00:0:0:0", "-1:0:0:0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if a, err := ParseSCSIAddress(s); err == nil && a.String() != s {
			t.Fatalf("%q parsed to %+v, prints %q", s, a, a.String())
		}
		if id, err := ParseSessionID(s); err == nil && id.String() != s {
			t.Fatalf("%q parsed to session %d", s, id)
		}
		if c, err := ParseConnectionID(s); err == nil && c.String() != s {
			t.Fatalf("%q parsed to %+v", s, c)
		}
		if strings.HasPrefix(s, "target") {
			_, _, _, _ = parseTargetDir(s)
		}
	})
}

// The decimal parser behind every sysfs number accepts exactly the
// kernel's spelling and round-trips it.
func FuzzParseNonNegative(f *testing.F) {
	for _, s := range []string{"0", "3260", "65536", "007", "+1", " 1", "1e3", "999999999", "1000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseNonNegative(s)
		if err != nil {
			return
		}
		if n < 0 || strconv.Itoa(n) != s {
			t.Fatalf("%q parsed to %d", s, n)
		}
		if p, err := parsePort(s); err == nil && (p > 65535 || p != n) {
			t.Fatalf("port %q parsed to %d", s, p)
		}
	})
}
