package iscsi

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/pathmend/pathmend/internal/sysbench"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// The benchmark node: 128 targets, each logged in through two portals
// (256 sessions of two connections each), one LUN per target with its
// disk on each session, and one multipath map per LUN over its two
// disks. Written once per test binary.
const benchTargets = 128

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

func benchNode(b *testing.B) sysfs.FS {
	b.Helper()
	bench.once.Do(func() {
		if bench.dir, bench.err = os.MkdirTemp("", "pathmend-iscsi-bench-"); bench.err != nil {
			return
		}
		var top iscsitest.Topology
		disk := func(n int) string { return fmt.Sprintf("sd%c%c", 'a'+n/26, 'a'+n%26) }
		for t := range benchTargets {
			wwid := fmt.Sprintf("naa.6001405%025x", t)
			m := iscsitest.Map{Device: fmt.Sprintf("dm-%d", t), Name: fmt.Sprintf("3%s", wwid[4:])}
			for p := range 2 {
				n := 2*t + p
				top.Sessions = append(top.Sessions, iscsitest.Session{
					ID: n + 1, Host: n, Target: fmt.Sprintf("iqn.2024-01.io.pathmend.test:t%d", t),
					Address: fmt.Sprintf("192.0.2.%d", p+1), TPGT: 1, RecoveryTmo: 5, Conns: 2,
					LUNs: []iscsitest.LUN{{LUN: 0, Disk: disk(n), WWID: wwid, Minor: n % 256}},
				})
				m.Slaves = append(m.Slaves, disk(n))
			}
			top.Maps = append(top.Maps, m)
		}
		bench.err = top.Write(bench.dir)
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return sysfs.New(bench.dir)
}

// BenchmarkRead is a full read of the node: what every session-heal tick
// cost before the Reader kept static attributes, and what pathmend
// diagnose and the attacher pay.
func BenchmarkRead(b *testing.B) {
	fsys := benchNode(b)
	b.ReportAllocs()
	ratio, reads := sysbench.Ratio(b, sysbench.ReadableFiles(b, fsys.Root()), func() {
		if s, err := Read(fsys, t0); err != nil || len(s.Sessions) != 2*benchTargets {
			b.Fatalf("read: %v", err)
		}
	})
	b.ReportMetric(reads, "read-syscalls/op")
	b.ReportMetric(ratio, "floor-ratio")
}

// BenchmarkReaderRead is the session heal's read in the steady state: a
// Reader that has read the node before reads it again, unchanged. It
// reports the attribute files, directories and stats one Read costs and
// floor-ratio: its time over one os.ReadFile pass over every readable
// attribute of the tree, timed in alternation.
func BenchmarkReaderRead(b *testing.B) {
	fsys := benchNode(b)
	r := NewReader(fsys)
	if _, err := r.Read(t0); err != nil {
		b.Fatal(err)
	}
	before := r.Counts()
	b.ReportAllocs()
	ratio, reads := sysbench.Ratio(b, sysbench.ReadableFiles(b, fsys.Root()), func() {
		if s, err := r.Read(t0); err != nil || len(s.Sessions) != 2*benchTargets {
			b.Fatalf("read: %v", err)
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

// BenchmarkReadFloor reads every readable attribute of the node once with
// os.ReadFile.
func BenchmarkReadFloor(b *testing.B) {
	files := sysbench.ReadableFiles(b, benchNode(b).Root())
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		sysbench.ReadAll(b, files)
	}
	b.ReportMetric(float64(len(files)), "files/op")
}
