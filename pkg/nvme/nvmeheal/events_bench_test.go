package nvmeheal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/internal/sysbench"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// BenchmarkIdleBackstop is one backstop period (30 s of the node's life)
// of `pathmend serve` idle on a node with 1,000 healthy staged NVMe/TCP
// volumes × 3 paths: its monitor ticks once (the 30 s backstop) and the
// kernel announces events/s relevant uevents during the period — each a
// reconnected controller of a random volume ("change nvme nvmeN",
// NVME_EVENT=connected), each in a batch of its own (the worst case: no
// two coalesce) — through the real loop (Monitor.HandleEvents: the
// model's lookup, the record store's Get, the read of the one subsystem,
// the plan, the model's write, the metrics) over a real record store and
// intent owner on disk. The steady state is measured: the first tick,
// which reads every attribute, and a first period run before the timer.
//
// It reports, per second of the node's life: core-fraction, the CPU time
// the process spent (user and system, from getrusage: the loop, the
// garbage collector, the runtime) over the second, the share of one core
// the loop costs; wall-fraction, the same from ns/op (inflated when the
// machine is shared: a benchmark waiting for a core counts); allocs/s
// and B/s; and RSS-MiB after the periods. The budget: core-fraction ≤
// 0.01 at events=100; RSS within 10 % of events=0.
func BenchmarkIdleBackstop(b *testing.B) {
	for _, rate := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("events=%d", rate), func(b *testing.B) { benchIdleBackstop(b, rate) })
	}
}

// backstop is the monitor interval of BenchmarkIdleBackstop: one op.
const backstop = 30 * time.Second

func benchIdleBackstop(b *testing.B, rate int) {
	fsys, recs := benchNode(b)
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair})
	if err != nil {
		b.Fatal(err)
	}
	tr, err := New(Config{Owned: true}, Deps{SysFS: fsys, Policy: policy, Connector: refusingConnector{b}, Host: benchHost,
		Prober: TCPProber{Timeout: time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	store, err := volume.NewStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range recs {
		r.AccessType, r.FSType = volume.AccessMount, "ext4"
		if err := store.Put(r); err != nil {
			b.Fatal(err)
		}
	}
	clk := clocktesting.NewFakeClock(time.Now())
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: store, Clock: clk, Runner: func(func()) { b.Fatal("a healthy node started a job") }})
	if err != nil {
		b.Fatal(err)
	}
	mdl := model.New()
	m, err := monitor.New(monitor.Config{Interval: backstop}, monitor.Deps{Intents: owner, Transports: []monitor.Transport{tr},
		Model: mdl, Policy: policy, Metrics: metrics.New(), SysFS: fsys, Clock: clk, PathExists: func(string) bool { return true }})
	if err != nil {
		b.Fatal(err)
	}
	alignAll(b, tr, recs)
	ctx := context.Background()
	m.Tick(ctx)
	rng := rand.New(rand.NewPCG(1, 2))
	event := func() uevent.Batch {
		c := rng.IntN(benchVolumes * benchPaths)
		name := fmt.Sprintf("nvme%d", c)
		return uevent.Batch{Events: []uevent.Event{{Seq: uint64(c), Action: uevent.Change, Subsystem: "nvme",
			DevPath: "/devices/virtual/nvme-fabrics/ctl/" + name, Env: map[string]string{"NVME_EVENT": "connected"}, Received: clk.Now()}}}
	}
	events := int(backstop/time.Second) * rate
	period := func() {
		for range events {
			clk.Step(backstop / time.Duration(events))
			rep := m.HandleEvents(ctx, event())
			if len(rep.Decisions) != 1 || rep.Decisions[0].Started || !rep.Decisions[0].Read {
				b.Fatalf("decisions: %+v", rep.Decisions)
			}
		}
		if events == 0 {
			clk.Step(backstop)
		}
		if rep := m.Tick(ctx); len(rep.Defects)+len(rep.Connects)+len(rep.Skipped) != 0 {
			b.Fatalf("healthy node: %+v", rep)
		}
	}
	period()
	runtime.GC()
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := cpuTime(b)
	b.ResetTimer()
	for b.Loop() {
		period()
	}
	b.StopTimer()
	cpu := cpuTime(b) - start
	runtime.ReadMemStats(&after)
	seconds := float64(b.N) * backstop.Seconds()
	b.ReportMetric(cpu.Seconds()/seconds, "core-fraction")
	b.ReportMetric(b.Elapsed().Seconds()/seconds, "wall-fraction")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/seconds, "allocs/s")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/seconds, "B/s")
	runtime.GC()
	debug.FreeOSMemory()
	b.ReportMetric(sysbench.RSSMiB(b), "RSS-MiB")
}

// cpuTime is the CPU time the process has used so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
