package uevent_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// TestDial_ReceivesTheKernelsEvents opens the real socket and makes the
// kernel announce something it announces on any Linux host: a loop
// device attached and detached (losetup). It waits for those events (the
// bound is a deadline for a broken socket, not a latency claim).
func TestDial_ReceivesTheKernelsEvents(t *testing.T) {
	testneed.Root(t, "attaching a loop device")
	losetup := testneed.Tools(t, map[string]string{"losetup": "mount"}, "losetup")[0]
	conn, err := uevent.Dial(0)
	if err != nil {
		t.Fatal(err)
	}
	src := uevent.NewSource(conn, uevent.Config{Filter: func(e uevent.Event) bool { return e.Subsystem == "block" }})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()

	img := filepath.Join(t.TempDir(), "img")
	if out, err := exec.Command("truncate", "-s", "1M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v: %s", err, out)
	}
	out, err := exec.Command(losetup, "--find", "--show", img).CombinedOutput()
	if err != nil {
		testneed.Skip(t, "losetup cannot attach a loop device here: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	name := filepath.Base(dev)
	if out, err := exec.Command(losetup, "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d: %v: %s", err, out)
	}
	var seen []uevent.Event
	for len(seen) < 2 {
		b, err := src.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the events of %s (seen %v): %v", name, seen, err)
		}
		if len(b.Lost) > 0 {
			t.Fatalf("events lost: %v", b.Lost)
		}
		for _, e := range b.Events {
			if e.Name() == name {
				seen = append(seen, e)
			}
		}
	}
	for _, e := range seen {
		if e.Env["DEVNAME"] != name || e.DevPath != "/devices/virtual/block/"+name || e.Seq == 0 || e.Received.IsZero() {
			t.Errorf("event %v: %v", e, e.Env)
		}
		if uevent.Relevant(e) {
			t.Errorf("a loop device's event is relevant: %v", e)
		}
	}
	if seen[1].Seq <= seen[0].Seq {
		t.Errorf("SEQNUM did not grow: %d then %d", seen[0].Seq, seen[1].Seq)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after its context ended", err)
	}
}
