package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/report"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// settle waits, at most d, until every volume has every path up and no
// recovery is due; a volume left short is visible in the report (a fault
// whose heal never completed).
func (s *soak) settle(ctx context.Context, d time.Duration) {
	ok := waitFor(ctx, d, func() bool {
		for _, v := range s.vols {
			if !s.allUp(v) || s.needsRecovery(s.state[v.id]) != "" {
				return false
			}
		}
		return true
	})
	if !ok {
		s.logf("not every path of every volume came back within %s: %s", d, s.pathsNow())
	}
}

// finalVerify reads every block of every volume back.
func (s *soak) finalVerify(ctx context.Context) {
	for _, v := range s.vols {
		st := s.state[v.id]
		st.lock.Lock()
		s.verify(ctx, st, "the end")
		st.lock.Unlock()
	}
}

// teardown unpublishes and unstages every volume, as kubelet does when
// the pods go, and stops pathmend the way kubelet stops a pod.
func (s *soak) teardown(ctx context.Context) {
	for _, v := range s.vols {
		st := s.state[v.id]
		st.lock.Lock()
		if old, err := st.worker.Swap(ctx, nil); err == nil && old != nil {
			old.Close()
		}
		_ = s.co.unpublish(ctx, v)
		_ = s.co.unstage(ctx, v, nil)
		st.lock.Unlock()
	}
	if s.pm.stop() {
		s.record(report.Action{At: time.Now(), What: "stop", Note: "pathmend serve, SIGTERM"})
	}
}

// orphansBounded is orphans, given up after d: a sysfs read that blocks
// (a kernel that wedged) is reported instead of hanging the soak.
func (s *soak) orphansBounded(d time.Duration) []string {
	done := make(chan []string, 1)
	go func() { done <- s.orphans() }()
	select {
	case o := <-done:
		return o
	case <-time.After(d):
		return []string{fmt.Sprintf("unknown: reading sysfs for what was left did not return within %s", d)}
	}
}

// orphans lists what the volumes left on the node once every one was
// unstaged: controllers to the soak's subsystems, sessions to its target,
// multipath maps, mounts under the kubelet directory, staged-volume
// records.
//
// The kernel finishes a deletion it was asked for after the call that
// asked returned (a controller's teardown, a session's removal): what is
// left is read again every second until nothing is, and only what stays
// for orphanSettle counts.
func (s *soak) orphans() []string {
	var out []string
	for deadline := time.Now().Add(orphanSettle); ; time.Sleep(time.Second) {
		if out = s.leftOver(); len(out) == 0 || time.Now().After(deadline) {
			return out
		}
	}
}

// orphanSettle bounds the wait for deletions in flight: they take
// milliseconds to seconds in the lab, loaded or not.
const orphanSettle = time.Minute

// leftOver is one read of what the volumes left on the node.
func (s *soak) leftOver() []string {
	var out []string
	sys := sysfs.New("/sys")
	if h, err := nvme.Read(sys); err != nil {
		out = append(out, "NVMe state unreadable: "+err.Error())
	} else {
		for _, c := range h.Controllers {
			if c.SubsysNQN == nqnA || c.SubsysNQN == nqnB {
				out = append(out, fmt.Sprintf("controller %s to %s at %s (%s)", c.Name, c.SubsysNQN, c.EndpointText(), c.State))
			}
		}
	}
	if snap, err := iscsi.Read(sys, time.Now()); err != nil {
		out = append(out, "iSCSI state unreadable: "+err.Error())
	} else {
		for _, x := range snap.SessionsOf(iqnI) {
			out = append(out, fmt.Sprintf("iSCSI %s to %s via %s (%s)", x.ID, x.TargetName, x.PortalString(), x.State))
		}
		for _, m := range snap.Maps {
			out = append(out, fmt.Sprintf("multipath map %s (%s) over %s", m.Device, m.Name, strings.Join(m.Slaves, ",")))
		}
	}
	for _, m := range mountedUnder(filepath.Join(s.cfg.root, "kubelet")) {
		out = append(out, "mount "+m)
	}
	entries, _ := os.ReadDir(filepath.Join(s.cfg.root, "state", "volumes"))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, "staged-volume record "+e.Name())
		}
	}
	return out
}

// finish builds the report, writes it and prints it.
func (s *soak) finish(end time.Time, orphans []string) (bool, error) {
	f, err := os.Open(s.pm.log)
	if err != nil {
		return false, err
	}
	lines, err := report.ParseLog(f)
	f.Close()
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	runs := slices.Clone(s.runs)
	slices.SortFunc(runs, func(a, b report.FaultRun) int { return a.ID - b.ID })
	in := report.Input{
		Seed: s.cfg.seed, Start: s.start, End: end, Plan: s.plan, Faults: runs, Actions: s.actions,
		Tracker: s.tracker, Log: lines, ReadOnly: s.readOnly, Orphans: orphans, Kernel: s.kernel,
		Retries: slices.Clone(s.retries),
	}
	for _, v := range s.vols {
		st := s.state[v.id]
		st.mu.Lock()
		in.Volumes = append(in.Volumes, report.Volume{
			Spec: v.spec, Target: v.target, Block: v.block, Window: st.window,
			Stats: st.worker.Stats(), Verifications: slices.Clone(st.verifications),
		})
		st.mu.Unlock()
		if ro := st.worker.Stats().ReadOnly; !ro.IsZero() {
			in.ReadOnly = append(in.ReadOnly, report.ReadOnly{Volume: v.id, At: ro, Source: "a write failed with EROFS"})
		}
	}
	slices.SortFunc(in.ReadOnly, func(a, b report.ReadOnly) int { return a.At.Compare(b.At) })
	r := report.Build(in)
	for name, write := range map[string]func(*os.File) error{
		"report.txt":   func(f *os.File) error { r.Text(f); return nil },
		"report.json":  func(f *os.File) error { return r.JSON(f) },
		"timeline.txt": func(f *os.File) error { r.FullTimeline(f); return nil },
	} {
		f, err := os.Create(filepath.Join(s.cfg.out, name))
		if err != nil {
			return false, err
		}
		werr := write(f)
		if err := f.Close(); werr == nil {
			werr = err
		}
		if werr != nil {
			return false, werr
		}
	}
	fmt.Println()
	r.Text(os.Stdout)
	return r.Pass, nil
}
