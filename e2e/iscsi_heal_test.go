//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/flakyproxy"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

const proxyPortal = "127.0.0.3:3260"

// stuckOrFail drives the session to iqn through the proxy into the stuck
// state of open-iscsi #387 (flakyproxy.Proxy.Stuck), within 5 min.
func stuckOrFail(t *testing.T, sys sysfs.FS, proxy *flakyproxy.Proxy, iqn string) {
	t.Helper()
	var bound func() bool
	if s, ok := sessionTo(t, sys, iqn, proxyPortal); ok {
		bound = connBound(sys, s.ID)
	}
	o := flakyproxy.DefaultStuckOptions
	o.Logf = func(format string, args ...any) { t.Logf(format, args...) }
	// Reaching the stuck state is a race against iscsid's own reopen: a
	// lost attempt is made again, and counted as a retry.
	o.Lost = func(cause string) { retried(t, cause) }
	session := func() (bool, bool, string) {
		s, ok := sessionTo(t, sys, iqn, proxyPortal)
		return ok, ok && s.State.LoggedIn(), fmt.Sprintf("%s %s", s.ID, s.State)
	}
	if err := proxy.Stuck(context.Background(), session, bound, o); err != nil {
		t.Fatalf("could not reproduce a stuck session (open-iscsi #387) with iscsid 2.1.8: %v", err)
	}
}

func newHealer(t *testing.T, p *pathmendISCSI) *iscsi.SessionHealer {
	t.Helper()
	h, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Mode: heal.ModeRepair, Threshold: 10 * time.Second, VerifyWindow: time.Minute,
		Kicker: p.in, Prober: &iscsi.NetProber{Timeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// repairedAt returns the Repaired report of the node record at portal.
func repairedAt(reports []iscsi.Report, portal string) (iscsi.Report, bool) {
	for _, r := range reports {
		if r.Node.Portal.String() == portal && r.Verdict == heal.Repaired {
			return r, true
		}
	}
	return iscsi.Report{}, false
}

// A session stuck beside a live multipath path: the heal logs it out and
// in; the map keeps serving through the other path and gets its second
// path back.
func TestISCSI_HealRelogsInAStuckSessionBesideALivePath(t *testing.T) {
	l := needLab(t)
	proxy := startFlakyProxy(t, proxyPortal, "127.0.0.2:3260")
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-heal-mp"
	lioTarget(t, l, iqn, "e2e-heal-mp-lun0", "", "", "127.0.0.1", "127.0.0.2")
	p := newPathmendISCSI(t)
	ctx := context.Background()
	vc := iscsiContext(iqn, 0, "127.0.0.1", "127.0.0.3")
	a, err := p.att.Attach(ctx, volume.AttachRequest{VolumeID: "pv-mp", Context: vc})
	if err != nil {
		t.Fatal(err)
	}
	dev := a.Device
	// The attacher waits for multipathd's map as long as a loaded guest
	// needs (newPathmendISCSI): without one the volume is on one disk,
	// and "two paths in the map" below could never hold. Say so now.
	if !strings.HasPrefix(filepath.Base(dev.Path), "dm-") {
		t.Fatalf("attached %s, not a multipath map: multipathd assembled no map over the two paths within the attacher's wait", dev.Path)
	}
	rec := volume.Record{VolumeID: "pv-mp", Context: vc, Device: dev.Path, AccessType: volume.AccessBlock}
	p.recs.put(rec)
	stuck, _ := sessionTo(t, p.sys, iqn, proxyPortal)

	stuckOrFail(t, p.sys, proxy, iqn)
	if c := p.att.Health(ctx, rec); c.Status != volume.Degraded {
		t.Fatalf("health while stuck: %+v", c)
	}
	start := time.Now()
	reports := healUntil(t, ctx, newHealer(t, p), p, 6*time.Minute, func(rs []iscsi.Report) bool {
		_, ok := repairedAt(rs, proxyPortal)
		return ok
	})
	r, _ := repairedAt(reports, proxyPortal)
	t.Logf("repaired by %s in %s of healing; LOGGED_IN %s after the kick, new session %s", r.Kick, time.Since(start).Round(time.Second), r.TimeToLoggedIn, r.NewSession)
	if r.Kick != iscsi.KickRelogin {
		t.Errorf("kick %s, want %s (the map has another live path)", r.Kick, iscsi.KickRelogin)
	}
	if r.NewSession == stuck.ID {
		t.Errorf("a relogin makes a new session, still %s", stuck.ID)
	}
	eventually(t, 3*time.Minute, "Healthy", func() bool { return p.att.Health(ctx, rec).Status == volume.Healthy })
	eventually(t, 3*time.Minute, "two paths in the map", func() bool {
		slaves, err := os.ReadDir(filepath.Join("/sys/block", filepath.Base(dev.Path), "slaves"))
		return err == nil && len(slaves) == 2
	})
}

// A stuck session that becomes the last live path of a mounted file
// system. The proxied session is driven into the stuck state of
// open-iscsi #387 while the direct portal carries the map's I/O; then the
// direct portal drops and the map has no live path left: dm-multipath
// queues its I/O (the lab's multipath.conf: no_path_retry 24 × 5 s). A
// healer with pathmend's default threshold that first looks now, its clock
// starting with the outage — the slowest a heal can be — restarts iscsid
// (never a logout of a last path); the same disk comes back and the queued
// I/O completes. A writer that fsyncs all through the outage, the file
// written before it and a write after it prove the file system stayed
// writable with its data, and every path was down for less than the
// queueing window.
//
// Before the lab had a queueing policy (LIO's built-in no_path_retry 12,
// 60 s), this test's earlier form — the stuck session the only path from
// the start, down for the whole reproduction of the race — saw ext4 abort
// its journal when the 60 s ran out, 41 s before the heal, and report
// "Remounting filesystem read-only" at the first write after the heal:
// the outage outlasted the window; the iscsid restart did not do it.
func TestISCSI_HealRestartsIscsidForAStuckLastPath(t *testing.T) {
	l := needLab(t)
	proxy := startFlakyProxy(t, proxyPortal, "127.0.0.2:3260")
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-heal-last"
	lioTarget(t, l, iqn, "e2e-heal-last-lun0", "", "", "127.0.0.1", "127.0.0.2")
	p := newPathmendISCSI(t)
	ctx := context.Background()
	vc := iscsiContext(iqn, 0, "127.0.0.1", "127.0.0.3")
	a, err := p.att.Attach(ctx, volume.AttachRequest{VolumeID: "pv-last", Context: vc})
	if err != nil {
		t.Fatal(err)
	}
	dev := a.Device
	rec := volume.Record{VolumeID: "pv-last", Context: vc, Device: dev.Path, AccessType: volume.AccessMount, FSType: "ext4"}
	p.recs.put(rec)
	mnt := t.TempDir()
	l.sh(t, "mkfs.ext4 -q -F "+dev.Path+" && mount "+dev.Path+" "+mnt)
	t.Cleanup(func() { _, _ = l.trySh(t, 2*time.Minute, "umount -l "+mnt) })
	fs := watchFS(t, mnt)
	window := queueWindow(t, l, dev.Path)
	before, _ := sessionTo(t, p.sys, iqn, proxyPortal)
	if len(before.LUNs) != 1 || before.LUNs[0].Disk == "" {
		t.Fatalf("session before: %+v", before)
	}

	stuckOrFail(t, p.sys, proxy, iqn)
	w := startFsyncWriter(t, mnt)
	l.sh(t, "fault_drop_port 3260 127.0.0.1")
	restored := false
	restore := func() {
		if !restored {
			restored = true
			l.sh(t, "fault_restore_port 3260 127.0.0.1")
		}
	}
	t.Cleanup(restore)
	eventually(t, 4*time.Minute, "the map without a live path", func() bool {
		return p.att.Health(ctx, rec).Status == volume.Inaccessible
	})
	allDown := time.Now()
	t.Logf("every path of %s down at guest uptime %.1fs: the direct portal dropped, the proxied session stuck", dev.Path, uptime(t).Seconds())
	h, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Mode: heal.ModeRepair, Threshold: iscsi.DefaultThreshold, VerifyWindow: time.Minute,
		Kicker: p.in, Prober: &iscsi.NetProber{Timeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	var kick iscsi.Report
	healUntil(t, ctx, h, p, 5*time.Minute, func(rs []iscsi.Report) bool {
		for _, r := range rs {
			if r.Node.Portal.String() == proxyPortal && (r.Verdict == heal.Kicked || r.Verdict == heal.Repaired) {
				kick = r
				return true
			}
		}
		return false
	})
	if kick.Kick != iscsi.KickRestart {
		t.Fatalf("kick %s, want %s: the session is the last live path of a mounted disk", kick.Kick, iscsi.KickRestart)
	}
	// The restarted iscsid adopts the kernel's sessions one at a time and
	// waits for each to log in again: while the direct portal drops
	// packets, the adoption of the session through it never ends and the
	// stuck session after it is never adopted (measured: not LOGGED_IN 60 s
	// after the restart, nor 2 min after). The direct portal returns once
	// the kick is made, as a dropped portal does in the outage this test
	// stands for.
	restore()
	reports := healUntil(t, ctx, h, p, 6*time.Minute, func(rs []iscsi.Report) bool {
		_, ok := repairedAt(rs, proxyPortal)
		return ok
	})
	r, _ := repairedAt(reports, proxyPortal)
	t.Logf("repaired by %s; LOGGED_IN %s after the kick", r.Kick, r.TimeToLoggedIn)
	eventually(t, 2*time.Minute, "a live path in the map again", func() bool {
		return p.att.Health(ctx, rec).Status != volume.Inaccessible
	})
	down := time.Since(allDown)
	t.Logf("every path was down for %s (queueing window %s) until guest uptime %.1fs", down.Round(100*time.Millisecond), window, uptime(t).Seconds())
	if down >= window {
		t.Errorf("every path down for %s: not within the %s queueing window, so the file system's survival proves nothing", down.Round(time.Second), window)
	}
	after, _ := sessionTo(t, p.sys, iqn, proxyPortal)
	if after.ID != before.ID || len(after.LUNs) != 1 || after.LUNs[0].Disk != before.LUNs[0].Disk {
		t.Errorf("after the restart: %s %+v, want %s with disk %s kept", after.ID, after.LUNs, before.ID, before.LUNs[0].Disk)
	}
	w.stop(t)
	fs.assertIntact(t, l)
	restore()
}
