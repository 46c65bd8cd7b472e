package main

import (
	"maps"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func TestParseContext(t *testing.T) {
	got, err := parseContext("transport=nvme-tcp, nqn=nqn.2024-01.io.pathmend.lab:x,endpoints=127.0.0.1:4420;127.0.0.3:4420,nsid=1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"transport": "nvme-tcp", "nqn": "nqn.2024-01.io.pathmend.lab:x", "endpoints": "127.0.0.1:4420,127.0.0.3:4420", "nsid": "1"}
	if !maps.Equal(got, want) {
		t.Errorf("parseContext = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "transport", "=x", "a=1,,b=2"} {
		if _, err := parseContext(bad); err == nil {
			t.Errorf("parseContext(%q): no error", bad)
		}
	}
}

func TestHealthText(t *testing.T) {
	if got := healthText(nil); got != "HEALTHY" {
		t.Errorf("healthText(nil) = %q", got)
	}
	got := healthText([]*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: "PathsBelowExpected", Message: "1 of 2 paths live"}})
	if want := "DEGRADED PathsBelowExpected: 1 of 2 paths live"; got != want {
		t.Errorf("healthText = %q, want %q", got, want)
	}
}

func TestRunRejectsBadUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"stage"}, {"bogus", "-volume-id", "v"}, {"-endpoint", "tcp://x", "health", "-volume-id", "v"}} {
		if err := run(args, nil); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}
