package nvmeheal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strings"
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
	"github.com/pathmend/pathmend/pkg/sysfs"
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
	rng := rand.New(rand.NewPCG(1, 2))
	events := int(backstop/time.Second) * rate
	batches := make([]uevent.Batch, events)
	for i := range batches {
		c := rng.IntN(benchVolumes * benchPaths)
		batches[i] = uevent.Batch{Events: []uevent.Event{{Seq: uint64(i), Action: uevent.Change, Subsystem: "nvme",
			DevPath: fmt.Sprintf("/devices/virtual/nvme-fabrics/ctl/nvme%d", c), Env: map[string]string{"NVME_EVENT": "connected"}}}}
	}
	fsys, recs := benchNode(b)
	benchBackstop(b, fsys, recs, batches, func(rep monitor.EventReport) {
		if len(rep.Decisions) != 1 || rep.Decisions[0].Started || !rep.Decisions[0].Read {
			b.Fatalf("decisions: %+v", rep.Decisions)
		}
	})
}

// benchBackstop runs periods of the loop over the staged volumes recs
// of fsys: per period, the batches spread evenly over it (each received
// when it is handed to the loop, checked by check), then the tick. It
// reports what BenchmarkIdleBackstop says, and events/s, decisions/s and
// reads/s (the targets read).
func benchBackstop(b *testing.B, fsys sysfs.FS, recs []volume.Record, batches []uevent.Batch, check func(monitor.EventReport)) {
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
	var events, decisions, reads int
	period := func() {
		for _, bt := range batches {
			clk.Step(backstop / time.Duration(len(batches)))
			for i := range bt.Events {
				bt.Events[i].Received = clk.Now()
			}
			rep := m.HandleEvents(ctx, bt)
			check(rep)
			events += len(bt.Events)
			decisions += len(rep.Decisions)
			for _, d := range rep.Decisions {
				if d.Read {
					reads++
				}
			}
		}
		if len(batches) == 0 {
			clk.Step(backstop)
		}
		if rep := m.Tick(ctx); len(rep.Defects)+len(rep.Connects)+len(rep.Skipped) != 0 {
			b.Fatalf("healthy node: %+v", rep)
		}
	}
	period()
	events, decisions, reads = 0, 0, 0
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
	b.ReportMetric(float64(events)/seconds, "events/s")
	b.ReportMetric(float64(decisions)/seconds, "decisions/s")
	b.ReportMetric(float64(reads)/seconds, "reads/s")
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

// foreignSubsystems is how many subsystems of another driver the node of
// BenchmarkEventMix has besides the 1,000 staged ones.
const foreignSubsystems = 10

// BenchmarkEventMix is BenchmarkIdleBackstop with the events of a node
// at work, events/s a second (30 s × events/s per backstop period), in
// this mix out of every 100:
//
//   - 50 in 10 bursts of 5, each burst one target's paths coming back
//     after a blip at the target (its 3 controllers' "change nvme"
//     NVME_EVENT=connected and 2 "change block" of its head, as the
//     lab's kernel sends them after a port is restored), received
//     together: one batch, one decision;
//   - 10 single reconnects of a random staged volume's controller, each
//     a batch of its own;
//   - 30 of block devices no staged volume uses, each a batch of its
//     own: a local disk's partitions and dm maps added, changed and
//     removed ("sdX" below an ATA host, "dm-N");
//   - 10 of another driver's NVMe subsystem on the node (its
//     controllers' "change nvme"), each a batch of its own.
//
// Nothing is to be done on the node: no decision starts a job.
func BenchmarkEventMix(b *testing.B) {
	for _, rate := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("events=%d", rate), func(b *testing.B) { benchEventMix(b, rate) })
	}
}

func benchEventMix(b *testing.B, rate int) {
	rng := rand.New(rand.NewPCG(3, 4))
	var batches []uevent.Batch
	seq := uint64(0)
	ev := func(a uevent.Action, subsystem, devpath string, env map[string]string) uevent.Event {
		seq++
		return uevent.Event{Seq: seq, Action: a, Subsystem: subsystem, DevPath: devpath, Env: env}
	}
	connected := map[string]string{"NVME_EVENT": "connected"}
	ctl := func(c int) string { return fmt.Sprintf("/devices/virtual/nvme-fabrics/ctl/nvme%d", c) }
	head := func(s int) string { return fmt.Sprintf("/devices/virtual/nvme-subsystem/nvme-subsys%d/nvme%dn1", s, s) }
	actions := []uevent.Action{uevent.Add, uevent.Change, uevent.Remove}
	for range int(backstop/time.Second) * rate / 100 {
		var round []uevent.Batch
		for range 10 {
			s := rng.IntN(benchVolumes)
			round = append(round, uevent.Batch{Events: []uevent.Event{
				ev(uevent.Change, "block", head(s), nil),
				ev(uevent.Change, "nvme", ctl(s*benchPaths), connected),
				ev(uevent.Change, "block", head(s), nil),
				ev(uevent.Change, "nvme", ctl(s*benchPaths+1), connected),
				ev(uevent.Change, "nvme", ctl(s*benchPaths+2), connected),
			}})
		}
		for range 10 {
			round = append(round, uevent.Batch{Events: []uevent.Event{ev(uevent.Change, "nvme", ctl(rng.IntN(benchVolumes*benchPaths)), connected)}})
		}
		for i := range 30 {
			a := actions[rng.IntN(len(actions))]
			dev := fmt.Sprintf("/devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda%d", 1+rng.IntN(8))
			if i%2 == 1 {
				dev = fmt.Sprintf("/devices/virtual/block/dm-%d", rng.IntN(16))
			}
			round = append(round, uevent.Batch{Events: []uevent.Event{ev(a, "block", dev, nil)}})
		}
		for range 10 {
			c := (benchVolumes+rng.IntN(foreignSubsystems))*benchPaths + rng.IntN(benchPaths)
			round = append(round, uevent.Batch{Events: []uevent.Event{ev(uevent.Change, "nvme", ctl(c), connected)}})
		}
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		batches = append(batches, round...)
	}
	fsys, recs := benchNodeOf(b, benchVolumes+foreignSubsystems)
	benchBackstop(b, fsys, recs[:benchVolumes], batches, func(rep monitor.EventReport) {
		for _, d := range rep.Decisions {
			if d.Started {
				b.Fatalf("a job started: %+v", d)
			}
			if d.Read && !strings.HasPrefix(d.Words, "no job: every path") {
				b.Fatalf("decision: %+v", d)
			}
		}
	})
}
