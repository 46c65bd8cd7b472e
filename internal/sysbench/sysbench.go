// Package sysbench is test support only: what the benchmarks of pathmend's
// sysfs readers measure besides time. The floor (every readable attribute
// file of a tree read once with os.ReadFile, the cost of one naive pass
// over it), the read(2) calls of the process (/proc/self/io syscr), its
// resident memory (/proc/self/status VmRSS), and a Ratio that times a
// reader against the floor in alternation, so that a shared, noisy
// machine slows both alike. No production code imports it.
package sysbench

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ReadableFiles lists every readable regular file below root.
func ReadableFiles(b testing.TB, root string) []string {
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

// ReadAll reads every file with os.ReadFile: one pass of the floor.
func ReadAll(b testing.TB, files []string) {
	for _, f := range files {
		if _, err := os.ReadFile(f); err != nil {
			b.Fatal(err)
		}
	}
}

// ReadSyscalls returns the read(2)-family calls the process made so far.
// It skips the benchmark where /proc/self/io is missing.
func ReadSyscalls(b testing.TB) int64 { return procField(b, "/proc/self/io", "syscr:") }

// RSSMiB returns the process's resident memory in MiB.
func RSSMiB(b testing.TB) float64 {
	return float64(procField(b, "/proc/self/status", "VmRSS:")) / 1024
}

func procField(b testing.TB, file, key string) int64 {
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

// Ratio runs op (timed by the benchmark) and then, with the timer
// stopped, one floor pass over files, b.N times, and returns op's time
// over the floor's and the read(2) calls per op. The heap is collected
// before each timed run, so that neither pays for the other's garbage
// (a floor pass over a large tree leaves tens of megabytes).
func Ratio(b *testing.B, files []string, op func()) (ratio, readsPerOp float64) {
	// The calls of one probe, negated: the second count includes the
	// first probe's own read.
	first := ReadSyscalls(b)
	probe := first - ReadSyscalls(b)
	var opTime, floorTime time.Duration
	var reads int64
	runtime.GC()
	b.ResetTimer()
	for b.Loop() {
		before := ReadSyscalls(b)
		start := time.Now()
		op()
		opTime += time.Since(start)
		reads += ReadSyscalls(b) - before + probe
		b.StopTimer()
		runtime.GC()
		start = time.Now()
		ReadAll(b, files)
		floorTime += time.Since(start)
		runtime.GC()
		b.StartTimer()
	}
	b.StopTimer()
	return float64(opTime) / float64(floorTime), float64(reads) / float64(b.N)
}
