package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/observe"
	"github.com/pathmend/pathmend/hack/lab/soak/plan"
	"github.com/pathmend/pathmend/hack/lab/soak/report"
	"github.com/pathmend/pathmend/hack/lab/soak/workload"
	"github.com/pathmend/pathmend/internal/flakyproxy"
)

type config struct {
	lab, out, root string
	seed           uint64
	duration       time.Duration
	options        plan.Options
}

// soak is one run.
type soak struct {
	cfg   config
	vols  []*vol
	state map[string]*volState
	plan  plan.Plan
	pm    *pathmend
	co    *co
	proxy *flakyproxy.Proxy
	start time.Time

	mu       sync.Mutex
	actions  []report.Action
	runs     []report.FaultRun
	tracker  *observe.Tracker
	kernel   []report.Event
	readOnly []report.ReadOnly
	retries  []string
}

// volState is what the soak keeps of one volume while it runs.
type volState struct {
	v *vol
	// lock is held by whatever unstages the volume or breaks it on
	// purpose (a restage, a recovery, a disabled namespace).
	lock   sync.Mutex
	worker *workload.Worker
	dev    workload.Device
	window time.Duration

	mu            sync.Mutex
	verifications []report.Verification
	recovered     time.Time
}

func newSoak(c config) (*soak, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the soak runs as root in the lab guest (make soak)")
	}
	vs := volumes()
	s := &soak{cfg: c, vols: vs, state: map[string]*volState{}}
	for _, v := range vs {
		s.state[v.id] = &volState{v: v}
	}
	var specs []observe.VolumeSpec
	for _, v := range vs {
		specs = append(specs, v.spec)
	}
	s.tracker = observe.NewTracker(specs)
	return s, nil
}

func (s *soak) record(a report.Action) {
	s.mu.Lock()
	s.actions = append(s.actions, a)
	s.mu.Unlock()
	e := ""
	if a.Err != "" {
		e = ": " + a.Err
	}
	s.logf("%s %s%s %s", a.What, a.Volume, e, a.Note)
}

// retried records a step the soak made again, with its cause; the
// report counts and lists it.
func (s *soak) retried(cause string) {
	s.mu.Lock()
	s.retries = append(s.retries, cause)
	s.mu.Unlock()
	s.logf("RETRY: %s", cause)
}

func (s *soak) logf(format string, args ...any) {
	fmt.Printf("[soak %7.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

// sh runs a script with the lab's target helpers and the soak's loaded.
func (s *soak) sh(ctx context.Context, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	full := "set -euo pipefail\n. " + filepath.Join(s.cfg.lab, "guest", "targets.sh") + "\n. " +
		filepath.Join(s.cfg.lab, "guest", "soak_lib.sh") + "\n" + script
	cmd := exec.CommandContext(ctx, "bash", "-c", full)
	cmd.Env = append(os.Environ(), "LAB_BIN="+filepath.Join(s.cfg.lab, "bin"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", script, err, bytes.TrimSpace(errb.Bytes()))
	}
	return string(bytes.TrimSpace(out.Bytes())), nil
}

// run is the whole soak; it reports whether every check passed.
func (s *soak) run(ctx context.Context) (bool, error) {
	s.start = time.Now()
	for _, d := range []string{s.cfg.out, filepath.Join(s.cfg.root, "state"), filepath.Join(s.cfg.root, "kubelet")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return false, err
		}
	}
	s.plan = plan.Make(s.cfg.seed, s.cfg.duration, topology(s.vols), s.cfg.options)
	if err := writeJSON(filepath.Join(s.cfg.out, "plan.json"), s.plan); err != nil {
		return false, err
	}
	s.logf("seed %d: %d faults planned over %s (replay: SOAK_SEED=%d)", s.cfg.seed, len(s.plan.Faults), s.cfg.duration, s.cfg.seed)
	for _, f := range s.plan.Faults {
		s.logf("  %s", f)
	}

	var err error
	if s.proxy, err = flakyproxy.Listen(proxyListen, proxyTarget, nil); err != nil {
		return false, fmt.Errorf("flaky proxy: %w", err)
	}
	defer s.proxy.Close()
	s.pm = newPathmend(filepath.Join(s.cfg.lab, "bin", "pathmend"), s.cfg.root, filepath.Join(s.cfg.out, "pathmend.log"), "/run/lab/restart-iscsid.sh")
	if err := s.pm.start(); err != nil {
		return false, err
	}
	defer s.pm.stop()
	s.record(report.Action{At: time.Now(), What: "start", Note: "pathmend serve"})
	if s.co, err = newCO(s.pm.sock, s.cfg.root, s.record); err != nil {
		return false, err
	}
	defer s.co.conn.Close()

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchers sync.WaitGroup
	watchers.Add(2)
	go func() { defer watchers.Done(); s.observe(watchCtx) }()
	go func() { defer watchers.Done(); s.followKernel(watchCtx) }()
	defer stopWatch()

	for _, v := range s.vols {
		if err := s.bringUp(ctx, s.state[v.id], "setup"); err != nil {
			return false, fmt.Errorf("staging %s: %w", v.id, err)
		}
	}
	for _, v := range s.vols {
		st := s.state[v.id]
		st.window = s.window(ctx, v)
		s.logf("%s on %s, queueing window %s", v.id, s.tracker.Last().Devices[v.id], st.window)
	}

	ioCtx, stopIO := context.WithCancel(ctx)
	var workers sync.WaitGroup
	for _, v := range s.vols {
		workers.Add(1)
		go func() { defer workers.Done(); s.state[v.id].worker.Run(ioCtx) }()
	}
	recCtx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() { defer close(recDone); s.recoverLoop(recCtx) }()

	s.start = time.Now()
	s.logf("faults start")
	var faults sync.WaitGroup
	for _, f := range s.plan.Faults {
		faults.Add(1)
		go func() {
			defer faults.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(s.start.Add(f.At))):
			}
			r := s.runFault(ctx, f)
			s.mu.Lock()
			s.runs = append(s.runs, r)
			s.mu.Unlock()
		}()
	}
	faults.Wait()
	s.logf("every fault undone; settling")
	s.settle(ctx, 10*time.Minute) // a safety net: it returns once every path is up
	stopRec()
	<-recDone
	stopIO()
	workers.Wait()
	end := time.Now()

	s.finalVerify(ctx)
	s.teardown(ctx)
	orphans := s.orphansBounded(2 * time.Minute)
	stopWatch()
	// An observer blocked in a sysfs read (a kernel that wedged) must not
	// keep the report from being written.
	waited := make(chan struct{})
	go func() { watchers.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		s.logf("the observer did not stop within 30 s: blocked in a sysfs read")
	}
	return s.finish(end, orphans)
}

// bringUp stages and publishes a volume, opens its device and gives it to
// the volume's worker (a new worker the first time).
func (s *soak) bringUp(ctx context.Context, st *volState, why string) error {
	v := st.v
	if err := s.co.stage(ctx, v, nil); err != nil {
		return err
	}
	if err := s.co.publish(ctx, v); err != nil {
		return err
	}
	dev, err := s.open(v)
	if err != nil {
		return fmt.Errorf("open %s after %s: %w", v.id, why, err)
	}
	st.dev = dev
	if st.worker == nil {
		st.worker = workload.New(workload.Config{
			Volume: v.id, Interval: 250 * time.Millisecond, ReadEvery: 3, Stall: 2 * time.Second,
			Seed: s.cfg.seed,
		}, dev)
		return nil
	}
	if _, err := st.worker.Swap(ctx, dev); err != nil {
		return err
	}
	return nil
}

// Each volume's working set: 16 MiB of raw blocks, or 4 files of 1 MiB
// and 8 meta files.
const (
	rawBlocks    = 4096
	files        = 4
	blocksPerFil = 256
	metaFiles    = 8
)

func (s *soak) open(v *vol) (workload.Device, error) {
	if v.block {
		return workload.OpenRaw(s.co.target(v), rawBlocks, true)
	}
	dir := filepath.Join(s.co.target(v), "soak")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	return workload.OpenFiles(dir, files, blocksPerFil, metaFiles, true)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
