package nvme

import (
	"os"
	"sync"
	"testing"

	"github.com/pathmend/pathmend/internal/sysbench"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// The benchmark host: 1,000 subsystems of three controllers and one
// namespace each, written once per test binary (creating its ~80,000
// entries takes far longer than reading them).
const benchSubsystems, benchControllers = 1000, 3

var bench struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	os.Exit(code)
}

func benchTree(b *testing.B) sysfs.FS {
	b.Helper()
	bench.once.Do(func() {
		if bench.dir, bench.err = os.MkdirTemp("", "pathmend-nvme-bench-"); bench.err != nil {
			return
		}
		bench.err = nvmetest.Healthy(benchSubsystems, benchControllers, 1).Write(bench.dir, testNow)
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return sysfs.New(bench.dir)
}

// attributeFiles lists the attribute files Read opens for h, in the order
// it opens them, except optional attributes that do not exist (Read's
// failed attempts at them are part of its cost, not of the floor's).
func attributeFiles(fsys sysfs.FS, h *Host) []string {
	var files []string
	add := func(dir string, names ...string) {
		for _, n := range names {
			p := fsys.Path(dir + "/" + n)
			if _, err := os.Stat(p); err == nil {
				files = append(files, p)
			}
		}
	}
	for _, s := range h.Subsystems {
		dir := classSubsystem + "/" + string(s.Name)
		add(dir, "subsysnqn", "model", "serial", "iopolicy", "subsystype")
		for _, ns := range s.Namespaces {
			add(dir+"/"+string(ns.Head), "nsid", "nguid", "uuid", "wwid", "size")
		}
	}
	for _, c := range h.Controllers {
		dir := classNVMe + "/" + string(c.Name)
		add(dir, "state", "transport", "cntlid", "subsysnqn", "kato", "address", "hostnqn", "ctrl_loss_tmo", "reconnect_delay", "fast_io_fail_tmo")
	}
	for _, s := range h.Subsystems {
		for _, ns := range s.Namespaces {
			for _, p := range ns.Paths {
				add(classNVMe+"/"+string(p.Controller)+"/"+string(p.Device), "ana_state", "ana_grpid")
			}
		}
	}
	return files
}

// BenchmarkInspect is one monitor tick's diagnosis: Read the whole host,
// then Inspect it.
func BenchmarkInspect(b *testing.B) {
	fsys := benchTree(b)
	h, err := Read(fsys)
	if err != nil {
		b.Fatal(err)
	}
	if len(h.Controllers) != benchSubsystems*benchControllers {
		b.Fatalf("read %d controllers", len(h.Controllers))
	}
	files := len(attributeFiles(fsys, h))
	b.ReportAllocs()
	b.ResetTimer()
	before := sysbench.ReadSyscalls(b)
	for b.Loop() {
		h, err := Read(fsys)
		if err != nil {
			b.Fatal(err)
		}
		if d := Inspect(h, nil); len(d) != 0 {
			b.Fatalf("healthy tree: %d defects", len(d))
		}
	}
	b.ReportMetric(float64(files), "files/op")
	b.ReportMetric(float64(sysbench.ReadSyscalls(b)-before)/float64(b.N), "read-syscalls/op")
}

// BenchmarkReadFileFloor reads the same attribute files with os.ReadFile
// in a loop: what reading them costs with nothing else around it.
func BenchmarkReadFileFloor(b *testing.B) {
	fsys := benchTree(b)
	h, err := Read(fsys)
	if err != nil {
		b.Fatal(err)
	}
	files := attributeFiles(fsys, h)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, f := range files {
			if _, err := os.ReadFile(f); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(files)), "files/op")
}

// BenchmarkInspectOnly is the diagnosis alone, on a Host read once: the
// share of a tick that is not sysfs.
func BenchmarkInspectOnly(b *testing.B) {
	h, err := Read(benchTree(b))
	if err != nil {
		b.Fatal(err)
	}
	want := volumesOf(h)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if d := Inspect(h, want); len(d) != 0 {
			b.Fatalf("healthy tree: %d defects", len(d))
		}
	}
}

// BenchmarkReaderRead is the read of a monitor tick in the steady state:
// a Reader that has read the host before reads it again, unchanged. It
// reports the attribute files, directories and stats one Read costs and
// floor-ratio: its time over one pass of BenchmarkReadFileFloor's loop
// (every attribute file a full Read opens, with os.ReadFile), timed in
// alternation.
func BenchmarkReaderRead(b *testing.B) {
	fsys := benchTree(b)
	r := NewReader(fsys, ScopeAll)
	h, err := r.Read()
	if err != nil {
		b.Fatal(err)
	}
	files := attributeFiles(fsys, h)
	before := r.Counts()
	b.ReportAllocs()
	ratio, reads := sysbench.Ratio(b, files, func() {
		if _, err := r.Read(); err != nil {
			b.Fatal(err)
		}
	})
	after := r.Counts()
	n := float64(b.N)
	b.ReportMetric(float64(after.Reads-before.Reads)/n, "files/op")
	b.ReportMetric(float64(after.Lists-before.Lists)/n, "dirs/op")
	b.ReportMetric(float64(after.Stats-before.Stats)/n, "stats/op")
	b.ReportMetric(reads, "read-syscalls/op")
	b.ReportMetric(ratio, "floor-ratio")
}
