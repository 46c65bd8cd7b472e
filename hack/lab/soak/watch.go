package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/observe"
	"github.com/pathmend/pathmend/hack/lab/soak/report"
	"github.com/pathmend/pathmend/internal/kmsg"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// sampleEvery is the observer's pace: a path's state is known to within
// this, and a teardown's last healthy sample is at most this old.
const sampleEvery = 250 * time.Millisecond

// observe samples the kernel until ctx ends.
func (s *soak) observe(ctx context.Context) {
	sys := sysfs.New("/sys")
	// The paths scope is all a sample needs, and it reads a controller's
	// address once, when it is first live, where the full scope reads it
	// on every sample while the controller is live: each read of address
	// is a chance to meet the 6.1 kernel's nvme_tcp_get_address oops if
	// the controller starts a reset at that moment.
	nr, ir := nvme.NewReader(sys, nvme.ScopePaths), iscsi.NewReader(sys)
	var specs []observe.VolumeSpec
	for _, v := range s.vols {
		specs = append(specs, v.spec)
	}
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		now := time.Now()
		h, err := nr.Read()
		var snap *iscsi.Snapshot
		if err == nil {
			snap, err = ir.Read(now)
		}
		smp := observe.Take(now, h, snap, specs)
		smp.Err = err
		s.mu.Lock()
		s.tracker.Add(smp)
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// last is the observer's latest sample.
func (s *soak) last() observe.Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.Last()
}

// pathUp reports whether the observer saw the path of volume up.
func (s *soak) pathUp(volume, p string) bool {
	return s.last().Paths[observe.PathKey(volume, p)].Up
}

// allUp reports whether every path of v is up.
func (s *soak) allUp(v *vol) bool {
	smp := s.last()
	for _, p := range v.spec.Paths {
		if !smp.Paths[observe.PathKey(v.id, p.ID)].Up {
			return false
		}
	}
	return true
}

// followKernel keeps the kernel's storage lines for the timeline and
// turns ext4's read-only remounts into read-only events of their volume.
func (s *soak) followKernel(ctx context.Context) {
	boot := bootTime()
	err := kmsg.Follow(ctx, kmsg.Path, 500*time.Millisecond, func(r kmsg.Record) {
		if !storageLine(r.Msg) {
			return
		}
		at := boot.Add(r.At)
		s.mu.Lock()
		s.kernel = append(s.kernel, report.Event{At: at, What: "kernel: " + r.Msg})
		s.mu.Unlock()
		if dev, ok := remountedReadOnly(r.Msg); ok {
			for id, d := range s.last().Devices {
				if d == dev {
					s.mu.Lock()
					s.readOnly = append(s.readOnly, report.ReadOnly{Volume: id, At: at, Source: "kernel: " + r.Msg})
					s.mu.Unlock()
				}
			}
		}
	})
	if err != nil {
		s.logf("kernel log: %v", err)
	}
}

// remountedReadOnly matches "EXT4-fs (dm-0): Remounting filesystem
// read-only" and returns the device.
func remountedReadOnly(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, "EXT4-fs (")
	if !ok {
		return "", false
	}
	dev, tail, ok := strings.Cut(rest, "): ")
	return dev, ok && strings.HasPrefix(tail, "Remounting filesystem read-only")
}

func storageLine(msg string) bool {
	if report.KernelCrash(msg) {
		return true
	}
	// The first lines of a kernel warning or a hung-task report, so that
	// a stack trace in the timeline says what it is (a run saw one in
	// iscsid's session removal whose header was left out).
	for _, p := range []string{"WARNING: ", "INFO: task ", "RIP: "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	for _, p := range []string{"EXT4", "JBD2", "Buffer I/O", "I/O error", "device-mapper", "nvme", "session", "connection", "sd ", "scsi"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// bootTime is the wall-clock time the machine booted, to place kernel log
// records (stamped with the time since boot) on the timeline.
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Now()
	}
	f := strings.Fields(string(b))
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(secs * float64(time.Second)))
}

// window is a volume's queueing window, read from the kernel: for NVMe,
// fast_io_fail_tmo of its controllers if set, else ctrl_loss_tmo (when
// the controllers are gone the head goes too); for iSCSI, dm-multipath's
// no_path_retry × polling_interval of its map.
func (s *soak) window(ctx context.Context, v *vol) time.Duration {
	const unbounded = 24 * time.Hour
	if v.group == "iscsi" {
		dev := s.last().Devices[v.id]
		out, err := s.sh(ctx, "soak_queue_window "+dev)
		n, perr := strconv.Atoi(out)
		if err != nil || perr != nil {
			s.logf("%s: no bounded queueing on %s (%q, %v): no read-only remount is explained", v.id, dev, out, err)
			return unbounded
		}
		return time.Duration(n) * time.Second
	}
	h, err := nvme.Read(sysfs.New("/sys"))
	if err != nil {
		return unbounded
	}
	w := unbounded
	for _, c := range h.Controllers {
		if c.SubsysNQN != v.target {
			continue
		}
		switch {
		case !c.FastIOFailTmo.Off && c.FastIOFailTmo.Seconds >= 0:
			w = min(w, time.Duration(c.FastIOFailTmo.Seconds)*time.Second)
		case !c.CtrlLossTmo.Off:
			w = min(w, time.Duration(c.CtrlLossTmo.Seconds)*time.Second)
		}
	}
	return w
}

// recoverLoop does what an operator does with a volume whose filesystem
// went read-only or whose device the kernel replaced: restart its pod
// (unpublish, unstage, stage, publish), then check every block written so
// far.
func (s *soak) recoverLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, v := range s.vols {
			st := s.state[v.id]
			why := s.needsRecovery(st)
			if why == "" || !st.lock.TryLock() {
				continue
			}
			// At least one path up, or the stage would only wait.
			if s.anyUp(v) {
				s.restageLocked(ctx, st, "recover: "+why, nil)
			}
			st.lock.Unlock()
		}
	}
}

func (s *soak) anyUp(v *vol) bool {
	smp := s.last()
	for _, p := range v.spec.Paths {
		if smp.Paths[observe.PathKey(v.id, p.ID)].Up {
			return true
		}
	}
	return false
}

// needsRecovery says why a volume needs its pod restarted, "" if not.
func (s *soak) needsRecovery(st *volState) string {
	st.mu.Lock()
	since := st.recovered
	st.mu.Unlock()
	if st.worker == nil {
		return ""
	}
	if ro := st.worker.Stats().ReadOnly; !ro.IsZero() && ro.After(since) {
		return "its filesystem is read-only"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.tracker.Replaced {
		if r.Volume == st.v.id && r.At.After(since) {
			return fmt.Sprintf("its device was replaced (%s → %s)", r.From, r.To)
		}
	}
	return ""
}

// mountedUnder lists the mount points under dir.
func mountedUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 4 && strings.HasPrefix(fs[4], dir+"/") {
			out = append(out, fs[4])
		}
	}
	return out
}
