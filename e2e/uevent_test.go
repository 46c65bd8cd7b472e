//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// Detection at the kernel's speed (docs/uevents.md): pathmend runs with a
// 30 s tick, so the tick cannot be what acts, and the test listens to the
// kernel's uevents itself — its own NETLINK_KOBJECT_UEVENT socket — to
// time each fault from the moment the kernel announced it. What pathmend
// logs ("Kernel event decision" at -v=2, "Reconnected path" with the
// connect's own time, "Heal verdict") is timed on the same clock (the
// guest's). The distributions are logged, and written to
// $PATHMEND_LAB/out/uevent-latency.tsv; the tests assert what the events
// decided, never a bound in seconds (a loaded TCG guest is slow, not
// wrong): docs/performance.md holds the measured figures against the
// 250 ms the design aims at.

const ueventInterval = "--monitor-interval=30s"

// ueventListener keeps every relevant kernel uevent the guest's kernel
// sends while a test runs.
type ueventListener struct {
	mu     sync.Mutex
	events []uevent.Event
	lost   []uevent.Loss
}

func listenUevents(t *testing.T) *ueventListener {
	t.Helper()
	conn, err := uevent.Dial(0)
	if err != nil {
		t.Fatalf("uevent socket: %v", err)
	}
	src := uevent.NewSource(conn, uevent.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	l := &ueventListener{}
	done := make(chan struct{})
	go func() { _ = src.Run(ctx); close(done) }()
	go func() {
		for {
			b, err := src.Next(ctx)
			if err != nil {
				return
			}
			l.mu.Lock()
			l.events = append(l.events, b.Events...)
			l.lost = append(l.lost, b.Lost...)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// wait waits for the first event after from that match accepts, and
// returns it; the test's listener losing events fails the test (its
// timing would be unknown).
func (l *ueventListener) wait(t *testing.T, what string, from time.Time, match func(uevent.Event) bool) uevent.Event {
	t.Helper()
	var got uevent.Event
	eventually(t, 2*time.Minute, "the kernel's uevent: "+what, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.lost) > 0 {
			t.Fatalf("the test's uevent listener lost events: %v", l.lost)
		}
		for _, e := range l.events {
			if !e.Received.Before(from) && match(e) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

func isEvent(action uevent.Action, subsystem, name string) func(uevent.Event) bool {
	return func(e uevent.Event) bool { return e.Action == action && e.Subsystem == subsystem && e.Name() == name }
}

// firstLine waits for the first line of pathmend's log at path, logged no
// earlier than from, that match accepts (klog flushes every 5 s).
func firstLine(t *testing.T, path, what string, from time.Time, match func(logLine) bool) logLine {
	t.Helper()
	var got logLine
	eventually(t, 2*time.Minute, "pathmend's log: "+what, func() bool {
		for _, x := range readLog(t, path) {
			if !logAt(x).Before(from.Truncate(time.Microsecond)) && match(x) {
				got = x
				return true
			}
		}
		return false
	})
	return got
}

func decisionOn(target string) func(logLine) bool {
	return func(x logLine) bool { return x.Msg == "Kernel event decision" && x.KV["target"] == target }
}

// latencies is one scenario's measured rounds.
type latencies struct {
	name  string
	cols  []string
	rows  [][]time.Duration
	notes []string
}

func (ls *latencies) add(row ...time.Duration) { ls.rows = append(ls.rows, row) }

// percentile is the nearest-rank percentile p of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// report logs each column's p50, p99 and max over the rounds, and writes
// the rounds to $PATHMEND_LAB/out/uevent-latency.tsv.
func (ls *latencies) report(t *testing.T) {
	t.Helper()
	for i, c := range ls.cols {
		var col []time.Duration
		for _, r := range ls.rows {
			col = append(col, r[i])
		}
		t.Logf("measured %s: %s over %d rounds: p50 %s, p99 %s, max %s", ls.name, c, len(col),
			percentile(col, .5).Round(time.Millisecond), percentile(col, .99).Round(time.Millisecond), percentile(col, 1).Round(time.Millisecond))
	}
	dir := os.Getenv("PATHMEND_LAB")
	if dir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, "out", "uevent-latency.tsv"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Logf("cannot write the latencies: %v", err)
		return
	}
	defer f.Close()
	for n, r := range ls.rows {
		var b strings.Builder
		fmt.Fprintf(&b, "%s\t%d", ls.name, n+1)
		for i, d := range r {
			fmt.Fprintf(&b, "\t%s=%.1f", ls.cols[i], float64(d.Microseconds())/1000)
		}
		fmt.Fprintln(f, b.String())
	}
}

// TestUevents_ADeletedControllerIsReconnectedOnTheKernelsEvent: an NVMe
// volume staged on two paths, pathmend ticking every 30 s. Twenty times,
// the non-optimized path's controller is deleted (delete_controller, as
// an outside actor does; the other path carries the volume): the kernel
// announces "remove nvme nvmeN", pathmend decides on the target at once
// ("Kernel event decision": job started) and that job connects the
// endpoint again ("Reconnected path"), each round before any tick could
// have. Measured per round: from the kernel's event to pathmend's
// decision, and to the reconnected path, with and without the connect
// itself (the "took" of its log line: probe and the kernel's connect).
func TestUevents_ADeletedControllerIsReconnectedOnTheKernelsEvent(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-uevents"
	nvmeTwoPortTarget(t, l, nqn)
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", ueventInterval)
	node := csi.NewNodeClient(conn)
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	rpc(t, "NodeStageVolume", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-uevents", staging, twoPathContext(nqn, 1)))
		return err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-uevents", StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstageVolume: %v", err)
		}
	})
	events := listenUevents(t)
	fsys := sysfs.New("/sys")
	rounds := 20
	lat := &latencies{name: "controller deleted → reconnected", cols: []string{"event→decision", "event→reconnected", "event→reconnected−connect", "connect"}}
	for round := 1; round <= rounds; round++ {
		var victim string
		eventually(t, 2*time.Minute, "a live controller to port 4421", func() bool {
			victim = nvmeControllerTo(t, nqn, "4421")
			return victim != "" && liveAddress(fsys, victim) != ""
		})
		before := time.Now()
		if err := os.WriteFile("/sys/class/nvme/"+victim+"/delete_controller", []byte("1"), 0o200); err != nil {
			t.Fatalf("round %d: delete %s: %v", round, victim, err)
		}
		ev := events.wait(t, "remove nvme "+victim, before, isEvent(uevent.Remove, "nvme", victim))
		dec := firstLine(t, logPath, "a decision on the target after the event", before, decisionOn("nvme-tcp "+nqn))
		if !strings.HasPrefix(dec.KV["decision"], "job started") {
			t.Fatalf("round %d: the event's decision: %s", round, dec.Raw)
		}
		rec := firstLine(t, logPath, "the path reconnected after the event", before, func(x logLine) bool {
			return x.Msg == "Reconnected path" && x.KV["endpoint"] == "127.0.0.1:4421"
		})
		took, err := time.ParseDuration(rec.KV["took"])
		if err != nil {
			t.Fatalf("round %d: the reconnect's took %q: %v", round, rec.KV["took"], err)
		}
		lines := readLog(t, logPath)
		if n := ticksBetween(lines, ev.Received.Add(-time.Second), logAt(dec)); n != 0 {
			t.Errorf("round %d: %d monitor ticks started between the event and its decision", round, n)
		}
		if logAt(rec).Before(logAt(dec)) {
			t.Errorf("round %d: reconnected (%s) before the event's decision (%s)", round, rec.Raw, dec.Raw)
		}
		toDecision := logAt(dec).Sub(ev.Received)
		toReconnect := logAt(rec).Sub(ev.Received)
		lat.add(toDecision, toReconnect, toReconnect-took, took)
		t.Logf("round %d: %s removed; decision %s after the event (pathmend's own receipt: %s), reconnected %s after (connect %s)",
			round, victim, toDecision.Round(time.Millisecond), dec.KV["sinceEvent"], toReconnect.Round(time.Millisecond), took.Round(time.Millisecond))
	}
	lat.report(t)
}

// TestUevents_AVanishedAndReturnedNamespaceIsDecidedOnAtOnce: the
// namespace of a staged volume is disabled on the target (its head
// vanishes: "remove block"), then enabled (a new head: "add block" below
// the subsystem, which pathmend resolves through sysfs). Each time
// pathmend reads the target and decides at once, with the tick 30 s
// away: the vanished namespace's job and its verdict (the rescan first),
// the returned one's head seen replaced under the staged filesystem
// (restage needed). Measured per round: event → decision, event → the
// first heal verdict of the vanished namespace, event → "Staged device
// replaced by the kernel".
func TestUevents_AVanishedAndReturnedNamespaceIsDecidedOnAtOnce(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-uevents-ns"
	nvmeTwoPortTarget(t, l, nqn)
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", ueventInterval)
	node := csi.NewNodeClient(conn)
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	rpc(t, "NodeStageVolume", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-uevents-ns", staging, twoPathContext(nqn, 1)))
		return err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-uevents-ns", StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstageVolume: %v", err)
			_, _ = l.trySh(t, 2*time.Minute, "umount -l "+staging)
		}
	})
	// The first tick wrote the volume into the model; its head is what a
	// removal names.
	waitTicks(t, logPath, time.Time{}, 1)
	events := listenUevents(t)
	target := "nvme-tcp " + nqn
	vanish := &latencies{name: "namespace vanished", cols: []string{"event→decision", "event→verdict"}}
	back := &latencies{name: "namespace returned", cols: []string{"event→decision", "event→replaced"}}
	for round := 1; round <= 5; round++ {
		before := time.Now()
		l.sh(t, fmt.Sprintf("nvmet_ns_disable %q 1", nqn))
		ev := events.wait(t, "a head removed", before, func(e uevent.Event) bool {
			return e.Action == uevent.Remove && e.Subsystem == "block" && strings.HasPrefix(e.Name(), "nvme")
		})
		dec := firstLine(t, logPath, "a decision on the vanished namespace's target", before, decisionOn(target))
		if !strings.HasPrefix(dec.KV["decision"], "job started") {
			t.Fatalf("round %d: vanished: %s", round, dec.Raw)
		}
		verdict := firstLine(t, logPath, "a heal verdict on the target", before, func(x logLine) bool {
			return x.Msg == "Heal verdict" && strings.Contains(x.KV["key"], nqn)
		})
		vanish.add(logAt(dec).Sub(ev.Received), logAt(verdict).Sub(ev.Received))
		t.Logf("round %d: vanished (%s): decision %s, verdict %s after the event: %s", round, ev, logAt(dec).Sub(ev.Received).Round(time.Millisecond),
			logAt(verdict).Sub(ev.Received).Round(time.Millisecond), verdict.Raw)

		before = time.Now()
		l.sh(t, fmt.Sprintf("nvmet_ns_enable %q 1", nqn))
		ev = events.wait(t, "a head added", before, func(e uevent.Event) bool {
			return e.Action == uevent.Add && e.Subsystem == "block" && strings.HasPrefix(e.Name(), "nvme") && !strings.Contains(e.Name(), "c")
		})
		dec = firstLine(t, logPath, "a decision on the returned namespace's target", before, decisionOn(target))
		row := []time.Duration{logAt(dec).Sub(ev.Received), 0}
		if round == 1 {
			// The staged filesystem is on the vanished head: the new one
			// replaced it (logged once per volume).
			rep := firstLine(t, logPath, "the staged device seen replaced", before, func(x logLine) bool {
				return x.Msg == "Staged device replaced by the kernel; the volume's pods must be restarted" && x.KV["volumeID"] == "vol-uevents-ns"
			})
			row[1] = logAt(rep).Sub(ev.Received)
			back.notes = append(back.notes, rep.Raw)
		}
		back.add(row...)
		t.Logf("round %d: returned (%s): decision %s after the event (%s)", round, ev, row[0].Round(time.Millisecond), dec.KV["decision"])
		if n := ticksBetween(readLog(t, logPath), before, logAt(dec)); n != 0 {
			t.Errorf("round %d: %d monitor ticks started between the fault and the event's decision", round, n)
		}
	}
	vanish.report(t)
	back.cols = back.cols[:1]
	for i := range back.rows {
		back.rows[i] = back.rows[i][:1]
	}
	back.report(t)
	for _, n := range back.notes {
		t.Logf("replaced: %s", n)
	}
}

// TestUevents_AnISCSISessionLoggedOutIsNoticedAtOnce: an iSCSI volume on
// two portals, pathmend ticking every 30 s. Three times an outside actor
// logs one session out (iscsiadm -m session -r SID -u): the kernel
// announces the session's removal, and pathmend reads the target at once:
// NodeGetVolumeHealth says DEGRADED with no tick in between. The session
// is logged in again by the test. Measured per round: event → pathmend's
// read of the target.
func TestUevents_AnISCSISessionLoggedOutIsNoticedAtOnce(t *testing.T) {
	l := needLab(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-uevents"
	v := stageServedISCSIOn(t, l, iqn, "uevents", []string{"127.0.0.1:3260", "127.0.0.2:3260"}, "--heal=repair", ueventInterval)
	waitTicks(t, v.proc.logPath, time.Time{}, 1)
	events := listenUevents(t)
	lat := &latencies{name: "iSCSI session logged out", cols: []string{"event→noticed"}}
	for round := 1; round <= 3; round++ {
		s := v.session(t, "127.0.0.2:3260")
		before := time.Now()
		l.sh(t, fmt.Sprintf("timeout 60 iscsiadm -m session -r %d -u", int(s.ID)))
		ev := events.wait(t, "remove iscsi_session "+s.ID.String(), before, isEvent(uevent.Remove, "iscsi_session", s.ID.String()))
		dec := firstLine(t, v.proc.logPath, "pathmend's read of the target after the event", before, decisionOn("iscsi "+iqn))
		if n := ticksBetween(readLog(t, v.proc.logPath), before, logAt(dec)); n != 0 {
			t.Errorf("round %d: %d monitor ticks started between the logout and the event's read", round, n)
		}
		hs := volumeHealth(t, v.node, "vol-uevents")
		if len(hs) == 0 || hs[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
			t.Errorf("round %d: health after the event = %v, want DEGRADED", round, hs)
		}
		lat.add(logAt(dec).Sub(ev.Received))
		t.Logf("round %d: %s removed; pathmend read the target %s after the event (%s)", round, s.ID, logAt(dec).Sub(ev.Received).Round(time.Millisecond), dec.KV["decision"])
		l.sh(t, fmt.Sprintf("timeout 60 iscsiadm -m node -T %q -p 127.0.0.2:3260 --login", iqn))
		eventually(t, 2*time.Minute, "the session logged in again", func() bool {
			s, ok := sessionTo(t, v.sys, iqn, "127.0.0.2:3260")
			return ok && s.State.LoggedIn()
		})
	}
	lat.report(t)
}
