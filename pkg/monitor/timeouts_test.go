package monitor

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// captureLogs sends klog's output to the returned buffer for the test.
func captureLogs(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false"})
	klog.SetOutput(&buf)
	t.Cleanup(func() { klog.SetOutput(nil); fs.Set("logtostderr", "true") })
	return &buf
}

// Controllers connected with the kernel's defaults (the fake kernel's:
// ctrl_loss_tmo 600, reconnect_delay 10, fast_io_fail_tmo off) are
// aligned with a staged volume's timeouts once per controller instance:
// the tick's read does not carry the timeouts, and nothing but a write
// changes them. A re-created controller is aligned again; observe mode
// writes nothing.
func TestTick_AlignsEachControllerOnce(t *testing.T) {
	logs := captureLogs(t)
	count := func() int {
		klog.Flush()
		return strings.Count(logs.String(), `"Aligned a timeout with the staged volumes"`)
	}
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.m.Tick(context.Background())
	if n := count(); n != 6 {
		t.Fatalf("first tick: %d timeouts aligned, want 6 (3 of each controller):\n%s", n, logs)
	}
	for _, want := range []string{`path="class/nvme/nvme0/reconnect_delay" from="10" to="5"`, `path="class/nvme/nvme1/ctrl_loss_tmo" from="600" to="-1"`, `path="class/nvme/nvme1/fast_io_fail_tmo" from="off" to="600"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no line with %s", want)
		}
	}
	for range 3 {
		r.clk.Step(time.Second)
		r.m.Tick(context.Background())
	}
	if n := count(); n != 6 {
		t.Errorf("aligned controllers read and written again: %d lines", n)
	}
	// nvme1 is re-created with the kernel's defaults (deleted and
	// connected again by someone else: the fake kernel publishes what a
	// connect asked for, and the monitor's own reconnect asks for the
	// volume's timeouts).
	r.k.Disconnect("nvme1")
	r.connectAged(t, nqnA, "127.0.0.2")
	r.clk.Step(time.Second)
	r.m.Tick(context.Background())
	r.clk.Step(time.Second)
	r.m.Tick(context.Background())
	if n := count(); n != 9 {
		t.Errorf("after a controller was re-created: %d lines, want 9", n)
	}

	obs := newRig(t, heal.ModeObserve, nil)
	obs.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	obs.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	before := count()
	obs.m.Tick(context.Background())
	if n := count(); n != before {
		t.Errorf("observe mode aligned %d timeouts", n-before)
	}
}

// Timeouts are written under the target's lease, like every other change
// of the target: while an RPC holds it, nothing is aligned; the next tick
// after it is released aligns.
func TestTick_AlignsTimeoutsUnderTheTargetsLease(t *testing.T) {
	logs := captureLogs(t)
	count := func() int {
		klog.Flush()
		return strings.Count(logs.String(), `"Aligned a timeout with the staged volumes"`)
	}
	r := newRig(t, heal.ModeRepair, nil)
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	lease, err := r.owner.Lock(context.Background(), volume.Target{Transport: volume.TransportNVMeTCP, Name: nqnA}, "NodeStageVolume vol-b")
	if err != nil {
		t.Fatal(err)
	}
	rep := r.m.Tick(context.Background())
	if n := count(); n != 0 || !contains(rep.Skipped, "nvme-tcp "+nqnA+": busy: NodeStageVolume vol-b") {
		t.Fatalf("target held: %d timeouts aligned, skipped %v", n, rep.Skipped)
	}
	lease.Unlock()
	r.m.Tick(context.Background())
	if n := count(); n != 6 {
		t.Errorf("target free: %d timeouts aligned, want 6", n)
	}
}
