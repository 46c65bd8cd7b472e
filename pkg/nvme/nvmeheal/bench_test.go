package nvmeheal

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/sysbench"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

const benchVolumes, benchPaths = 1000, 3

// refusingConnector fails the benchmark if a healthy tick connects or
// tears down anything.
type refusingConnector struct{ b *testing.B }

func (r refusingConnector) Connect(context.Context, fabrics.Options) (fabrics.Result, error) {
	r.b.Fatal("healthy tick connected")
	return fabrics.Result{}, nil
}
func (r refusingConnector) Disconnect(string) error { r.b.Fatal("healthy tick tore down"); return nil }
func (r refusingConnector) Rescan(string) error     { r.b.Fatal("healthy tick rescanned"); return nil }

// memIntents serves a fixed listing, as the intent owner over a page-cached
// state dir would, and fails the benchmark if a healthy tick starts a job.
type memIntents struct {
	b *testing.B
	l volume.Listing
}

func (m memIntents) Scan() (volume.Listing, error) { return m.l, nil }
func (m memIntents) Generation() uint64            { return 0 }
func (m memIntents) Get(id string) (volume.Record, error) {
	for _, r := range m.l.Records {
		if r.VolumeID == id {
			return r, nil
		}
	}
	return volume.Record{}, volume.ErrNotFound
}
func (m memIntents) Go(context.Context, volume.Target, string, func(context.Context, *intent.Lease)) (bool, string) {
	m.b.Fatal("healthy tick started a job")
	return false, ""
}

// benchNode writes 1,000 subsystems × 3 live controllers, one namespace
// each, and the 1,000 staged-volume records that expect them.
func benchNode(b *testing.B) (sysfs.FS, []volume.Record) {
	return benchNodeOf(b, benchVolumes)
}

// benchNodeOf is benchNode with subsystems subsystems × 3 controllers,
// the first 1,000 staged: the others are another driver's.
func benchNodeOf(b *testing.B, subsystems int) (sysfs.FS, []volume.Record) {
	b.Helper()
	dir := b.TempDir()
	if err := nvmetest.Healthy(subsystems, benchPaths, 1).Write(dir, time.Now()); err != nil {
		b.Fatal(err)
	}
	recs := make([]volume.Record, 0, benchVolumes)
	for s := range benchVolumes {
		n := &volume.NVMeTCP{NQN: fmt.Sprintf("nqn.2024-01.io.pathmend.test:sub-%d", s), NSID: 1}
		for c := range benchPaths {
			n.Endpoints = append(n.Endpoints, volume.Endpoint{Host: "192.0.2.1", Port: uint16(4420 + c)})
		}
		n.OptimizedEndpoints = n.Endpoints[:1]
		recs = append(recs, volume.Record{VolumeID: fmt.Sprintf("vol-%04d", s), State: volume.StateStaged, StagingPath: dir, Context: volume.Context{Transport: volume.TransportNVMeTCP, NVMe: n}})
	}
	return sysfs.New(dir), recs
}

// benchMonitor is the loop over the NVMe transport for the staged
// volumes recs in repair mode, failing the benchmark if it connects or
// tears down anything.
func benchMonitor(b *testing.B, fsys sysfs.FS, recs []volume.Record) (*monitor.Monitor, *Transport, *model.Model) {
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair})
	if err != nil {
		b.Fatal(err)
	}
	tr, err := New(Config{Owned: true}, Deps{SysFS: fsys, Policy: policy, Connector: refusingConnector{b}, Host: benchHost,
		Prober: TCPProber{Timeout: time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	mdl := model.New()
	m, err := monitor.New(monitor.Config{}, monitor.Deps{Intents: memIntents{b: b, l: volume.Listing{Records: recs}},
		Transports: []monitor.Transport{tr}, Model: mdl, Policy: policy, Metrics: metrics.New(), SysFS: fsys,
		PathExists: func(string) bool { return true }})
	if err != nil {
		b.Fatal(err)
	}
	alignAll(b, tr, recs)
	return m, tr, mdl
}

var benchHost = fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"}

// alignAll does what the first ticks' jobs of a running plugin did: align
// the staged volumes' controller timeouts, so that a steady tick plans no
// job for them.
func alignAll(b *testing.B, t *Transport, recs []volume.Record) {
	h, err := t.reader.Read()
	if err != nil {
		b.Fatal(err)
	}
	byID := map[string]*volume.Record{}
	for i, r := range recs {
		byID[r.VolumeID] = &recs[i]
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			t.alignTimeouts(h, e.NQN, []nvme.Expectation{e}, byID)
		}
	}
}

// BenchmarkTick is one tick of the loop (pkg/monitor) with the NVMe
// transport over 1,000 healthy staged volumes × 3
// paths, in the steady state of a running plugin: the first tick (which
// reads every attribute, as a restarted plugin does) runs before the
// timer. A tick lists every directory, re-reads every attribute that can
// change, diagnoses, decides, reconciles and updates status and metrics.
//
// It reports the attribute files the tick read (files/op), the
// directories it listed (dirs/op), the stats it made (stats/op), its
// read(2) calls (read-syscalls/op, from /proc/self/io), the processes it
// started, the resident memory after the ticks and, because this machine
// is shared and absolute times drift between runs, floor-ratio: the
// tick's time over the time of one pass of BenchmarkTickReadFloor's
// os.ReadFile loop run right after each tick (timer stopped).
func BenchmarkTick(b *testing.B) {
	fsys, recs := benchNode(b)
	m, tr, mdl := benchMonitor(b, fsys, recs)
	floor := sysbench.ReadableFiles(b, fsys.Root())
	tick := func() {
		rep := m.Tick(context.Background())
		if len(rep.Defects) != 0 || len(rep.Connects) != 0 || len(rep.Skipped) != 0 {
			b.Fatalf("healthy node: %d defects, %d connects, %d skipped", len(rep.Defects), len(rep.Connects), len(rep.Skipped))
		}
	}
	tick()
	counts := tr.reader.Counts()
	b.ReportAllocs()
	ratio, reads := sysbench.Ratio(b, floor, tick)
	if st, _ := mdl.Snapshot().Volume("vol-0999"); func() int { l, _ := st.Live(); return l }() != benchPaths {
		b.Fatalf("status = %+v", st)
	}
	after := tr.reader.Counts()
	n := float64(b.N)
	b.ReportMetric(float64(after.Reads-counts.Reads)/n, "files/op")
	b.ReportMetric(float64(after.Lists-counts.Lists)/n, "dirs/op")
	b.ReportMetric(float64(after.Stats-counts.Stats)/n, "stats/op")
	b.ReportMetric(reads, "read-syscalls/op")
	b.ReportMetric(0, "processes/op") // the tick has no exec seam to start one
	b.ReportMetric(ratio, "floor-ratio")
	// Steady-state resident memory after the ticks: the tree generation
	// before the timer (a large in-memory fixture) is freed first, so
	// this approximates a plugin process holding 1,000 volumes.
	runtime.GC()
	debug.FreeOSMemory()
	b.ReportMetric(sysbench.RSSMiB(b), "RSS-MiB")
}

// BenchmarkTickForgetful is BenchmarkTick with a monitor that remembers
// nothing between ticks: every tick reads every attribute, as every tick
// did before the Reader kept static attributes, and as a restarted
// plugin's first tick does.
func BenchmarkTickForgetful(b *testing.B) {
	fsys, recs := benchNode(b)
	m, tr, _ := benchMonitor(b, fsys, recs)
	b.ReportAllocs()
	ratio, reads := sysbench.Ratio(b, sysbench.ReadableFiles(b, fsys.Root()), func() {
		tr.reader = nvme.NewReader(fsys, nvme.ScopePaths)
		if rep := m.Tick(context.Background()); len(rep.Defects)+len(rep.Connects)+len(rep.Skipped) != 0 {
			b.Fatalf("healthy node: %+v", rep)
		}
	})
	b.ReportMetric(reads, "read-syscalls/op")
	b.ReportMetric(ratio, "floor-ratio")
}

// BenchmarkTickReadFloor reads the same attribute files with os.ReadFile:
// what one pass over every attribute of the tree costs with nothing else
// around it. The generated tree holds exactly the attributes pathmend
// reads (and its write-only ones, which are not readable).
func BenchmarkTickReadFloor(b *testing.B) {
	fsys, _ := benchNode(b)
	files := sysbench.ReadableFiles(b, fsys.Root())
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		sysbench.ReadAll(b, files)
	}
	b.ReportMetric(float64(len(files)), "files/op")
}
