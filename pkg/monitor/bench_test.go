package monitor

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/metrics"
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

// benchNode writes 1,000 subsystems × 3 live controllers, one namespace
// each, and the 1,000 staged-volume records that expect them.
func benchNode(b *testing.B) (sysfs.FS, []volume.Record) {
	b.Helper()
	dir := b.TempDir()
	if err := nvmetest.Healthy(benchVolumes, benchPaths, 1).Write(dir, time.Now()); err != nil {
		b.Fatal(err)
	}
	recs := make([]volume.Record, 0, benchVolumes)
	for s := range benchVolumes {
		n := &volume.NVMeTCP{NQN: fmt.Sprintf("nqn.2024-01.io.pathmend.test:sub-%d", s), NSID: 1}
		for c := range benchPaths {
			n.Endpoints = append(n.Endpoints, volume.Endpoint{Host: "192.0.2.1", Port: uint16(4420 + c)})
		}
		n.OptimizedEndpoints = n.Endpoints[:1]
		recs = append(recs, volume.Record{VolumeID: fmt.Sprintf("vol-%04d", s), StagingPath: dir, Context: volume.Context{Transport: volume.TransportNVMeTCP, NVMe: n}})
	}
	return sysfs.New(dir), recs
}

// BenchmarkTick is one monitor tick over 1,000 healthy staged volumes × 3
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
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair})
	if err != nil {
		b.Fatal(err)
	}
	met := metrics.New()
	m, err := New(Config{}, Deps{SysFS: fsys, Records: func() ([]volume.Record, error) { return recs, nil },
		Policy: policy, Connector: refusingConnector{b}, Prober: TCPProber{Timeout: time.Millisecond}, Metrics: met,
		PathExists: func(string) bool { return true }})
	if err != nil {
		b.Fatal(err)
	}
	floor := readableFiles(b, fsys.Root())
	tick := func() {
		rep := m.Tick(context.Background())
		if len(rep.Defects) != 0 || len(rep.Connects) != 0 || len(rep.Skipped) != 0 {
			b.Fatalf("healthy node: %d defects, %d connects, %d skipped", len(rep.Defects), len(rep.Connects), len(rep.Skipped))
		}
	}
	tick()
	counts := m.nvme.Counts()
	probe := syscr(b) - syscr(b) // the read(2) calls of one syscr, negated
	var tickTime, floorTime time.Duration
	var reads int64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		before := syscr(b)
		start := time.Now()
		tick()
		tickTime += time.Since(start)
		reads += syscr(b) - before + probe
		b.StopTimer()
		start = time.Now()
		readAll(b, floor)
		floorTime += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	if st, _ := m.Status("vol-0999"); st.Paths.Live != benchPaths {
		b.Fatalf("status = %+v", st)
	}
	after := m.nvme.Counts()
	n := float64(b.N)
	b.ReportMetric(float64(after.Reads-counts.Reads)/n, "files/op")
	b.ReportMetric(float64(after.Lists-counts.Lists)/n, "dirs/op")
	b.ReportMetric(float64(after.Stats-counts.Stats)/n, "stats/op")
	b.ReportMetric(float64(reads)/n, "read-syscalls/op")
	b.ReportMetric(0, "processes/op") // the tick has no exec seam to start one
	b.ReportMetric(float64(tickTime)/float64(floorTime), "floor-ratio")
	// Steady-state resident memory after the ticks: the tree generation
	// before the timer (a large in-memory fixture) is freed first, so
	// this approximates a plugin process holding 1,000 volumes.
	runtime.GC()
	debug.FreeOSMemory()
	b.ReportMetric(float64(procField(b, "/proc/self/status", "VmRSS:"))/1024, "RSS-MiB")
}

// BenchmarkTickReadFloor reads the same attribute files with os.ReadFile:
// what the tick's one pass over sysfs costs with nothing else around it.
func BenchmarkTickReadFloor(b *testing.B) {
	fsys, _ := benchNode(b)
	files := readableFiles(b, fsys.Root())
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		readAll(b, files)
	}
	b.ReportMetric(float64(len(files)), "files/op")
}

// readAll reads every file with os.ReadFile.
func readAll(b *testing.B, files []string) {
	for _, f := range files {
		if _, err := os.ReadFile(f); err != nil {
			b.Fatal(err)
		}
	}
}

// readableFiles lists every readable attribute of the tree; the generated
// tree holds exactly the attributes pathmend reads (and its write-only
// ones, which are not readable).
func readableFiles(b *testing.B, root string) []string {
	b.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode().Perm()&0o444 != 0 {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func syscr(b *testing.B) int64 { return procField(b, "/proc/self/io", "syscr:") }

func procField(b *testing.B, file, key string) int64 {
	b.Helper()
	f, err := os.Open(file)
	if err != nil {
		b.Skipf("%s: %v", file, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	b.Fatalf("%s has no %s", file, key)
	return 0
}
