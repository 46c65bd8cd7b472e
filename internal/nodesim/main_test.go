package nodesim

import (
	"bytes"
	"flag"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// summary is printed after every test when TestSimulation ran: what the
// schedules covered, then, as the last line of the output, "N
// schedules, M violations".
var summary []string

func TestMain(m *testing.M) {
	// Schedules allocate little that lives long: a larger heap goal
	// spends less of their CPU time collecting.
	debug.SetGCPercent(400)
	code := m.Run()
	for _, line := range summary {
		fmt.Println(line)
	}
	os.Exit(code)
}

// stats counts what the schedules did, across schedules run in parallel.
type stats struct {
	mu       sync.Mutex
	releases map[string]int // seam kind → actors let through it
	crashes  map[string]int // seam kind → actors killed parked at it ("blocked": on a lock or asleep)
	events   map[string]int // kernel events delivered, lost, dropped; the loop's decisions, jobs and full reads
	traces   map[uint64]bool
	// foreign counts the foreign mounts made at recorded paths.
	foreign int
}

func (st *stats) foreignMounted() {
	st.mu.Lock()
	st.foreign++
	st.mu.Unlock()
}

func newStats() *stats {
	return &stats{releases: map[string]int{}, crashes: map[string]int{}, events: map[string]int{}, traces: map[uint64]bool{}}
}

func (st *stats) event(kind string, n int) {
	st.mu.Lock()
	st.events[kind] += n
	st.mu.Unlock()
}

// ran counts a schedule's trace: distinct traces are distinct
// interleavings (of decisions and outcomes).
func (st *stats) ran(trace []string) {
	h := fnv.New64a()
	for _, l := range trace {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	st.mu.Lock()
	st.traces[h.Sum64()] = true
	st.mu.Unlock()
}

func (st *stats) released(kind string) {
	st.mu.Lock()
	st.releases[kind]++
	st.mu.Unlock()
}

func (st *stats) crashedAt(kind string) {
	st.mu.Lock()
	st.crashes[kind]++
	st.mu.Unlock()
}

// seamKind names the kind of a seam: "put attaching", "connect",
// "iscsiadm -m node -o update -n node.startup", "write delete", "mount
// staging", …
func seamKind(what string) string {
	f := strings.Fields(strings.Trim(what, "[]"))
	switch {
	case len(f) == 0:
		return what
	case f[0] == "put" && len(f) > 2:
		return "put " + f[2]
	case f[0] == "write":
		return "write " + f[len(f)-1][strings.LastIndexByte(f[len(f)-1], '/')+1:]
	case f[0] == "mount" || f[0] == "unmount":
		if strings.Contains(what, "/pods/") {
			return f[0] + " publish"
		}
		return f[0] + " staging"
	case f[0] == "iscsiadm":
		k := []string{f[0]}
		for i := 1; i < len(f); i++ {
			switch {
			case (f[i] == "-m" || f[i] == "-o" || f[i] == "-n") && i+1 < len(f):
				k = append(k, f[i], f[i+1])
				i++
			case strings.HasPrefix(f[i], "--") || f[i] == "-u":
				k = append(k, f[i])
			}
		}
		return strings.Join(k, " ")
	case f[0] == "delete" || f[0] == "multipath" || f[0] == "multipathd":
		return strings.Join(f[:min(2, len(f))], " ")
	}
	return f[0]
}

// secrets watches every log line of the schedules for the CHAP secret.
// klog is process-wide, so a line cannot be told to one of the schedules
// running in parallel: a finding names the seeds that were running.
type secrets struct {
	mu      sync.Mutex
	running map[uint64]bool
	found   string
	lines   atomic.Int64
}

func (w *secrets) Write(p []byte) (int, error) {
	w.lines.Add(int64(bytes.Count(p, []byte{'\n'})))
	if i := bytes.Index(p, []byte(chapSecret)); i >= 0 {
		w.mu.Lock()
		if w.found == "" {
			w.found = fmt.Sprintf("a secret in a log line while seeds %v ran: …%s…",
				slices.Sorted(maps.Keys(w.running)), p[max(0, i-200):i+len(chapSecret)])
		}
		w.mu.Unlock()
	}
	return len(p), nil
}

func (w *secrets) run(seed uint64, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if on {
		w.running[seed] = true
	} else {
		delete(w.running, seed)
	}
}

// captureLogs sends klog's output, at the most verbose level pathmend
// logs at, to w for the rest of the test.
func captureLogs(t *testing.T, w *secrets) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	_ = fs.Set("v", "5")
	klog.SetOutput(w)
	t.Cleanup(func() { klog.Flush(); _ = fs.Set("logtostderr", "true"); klog.SetOutput(os.Stderr) })
}

// TestSimulation runs -schedules schedules (or the one -seed), in
// parallel across GOMAXPROCS, and ends the output with "N schedules, M
// violations". It stops starting schedules after three violations.
func TestSimulation(t *testing.T) {
	w := &secrets{running: map[uint64]bool{}}
	captureLogs(t, w)
	seeds := []uint64{*seedFlag}
	if *seedFlag == 0 {
		seeds = seeds[:0]
		for i := range *schedules {
			seeds = append(seeds, *firstSeed+uint64(i))
		}
	}
	st := newStats()
	var ran, violations atomic.Int64
	start := time.Now()
	t.Run("schedules", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				t.Parallel()
				if violations.Load() >= 3 {
					return
				}
				ran.Add(1)
				w.run(seed, true)
				defer w.run(seed, false)
				defer func() {
					if t.Failed() {
						violations.Add(1)
					}
				}()
				st.ran(run(t, seed, st))
			})
		}
	})
	klog.Flush()
	if w.found != "" {
		t.Error(w.found)
		violations.Add(1)
	}
	took := time.Since(start)
	summary = []string{
		fmt.Sprintf("%d schedules × %d steps in %s on %d CPUs: %.0f schedules/s", ran.Load(), *steps, took.Round(time.Millisecond), runtime.GOMAXPROCS(0), float64(ran.Load())/took.Seconds()),
		fmt.Sprintf("seams let through (kind: times): %s", counts(st.releases)),
		fmt.Sprintf("actors killed by a crash (where: times): %s", counts(st.crashes)),
		fmt.Sprintf("kernel events (what: how many): %s", counts(st.events)),
		fmt.Sprintf("(seam kind, crash) pairs covered: %d of %d seam kinds; distinct traces: %d", len(st.crashes)-boolInt(st.crashes["blocked"] > 0), len(st.releases), len(st.traces)),
		fmt.Sprintf("log lines checked for the CHAP secret: %d", w.lines.Load()),
		fmt.Sprintf("foreign mounts made at recorded paths (on top or slid under; unmounting one is a violation): %d", st.foreign),
		fmt.Sprintf("%d schedules, %d violations", ran.Load(), violations.Load()),
	}
	if violations.Load() > 0 {
		t.Fail()
	}
}

func counts(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

var replays = flag.Int("replays", 8, "seeds TestSimulationReplays runs twice (from -first)")

// TestSimulationReplays: a seed is its schedule. Two runs of each of a
// few seeds take the same decisions and see the same outcomes, step by
// step.
func TestSimulationReplays(t *testing.T) {
	captureLogs(t, &secrets{running: map[uint64]bool{}})
	for seed := *firstSeed; seed < *firstSeed+uint64(*replays); seed++ {
		first := run(t, seed, newStats())
		second := run(t, seed, newStats())
		if len(first) < *steps/2 {
			t.Fatalf("seed %d: a trace of %d lines", seed, len(first))
		}
		if !slices.Equal(first, second) {
			i := 0
			for i < min(len(first), len(second)) && first[i] == second[i] {
				i++
			}
			t.Errorf("seed %d: the second run differs at line %d:\nfirst:  %s\nsecond: %s",
				seed, i, at(first, i), at(second, i))
		}
	}
}

func at(trace []string, i int) string {
	if i < len(trace) {
		return trace[i]
	}
	return "(end)"
}
