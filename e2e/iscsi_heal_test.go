//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/flakyproxy"
	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

const (
	proxyPortal = "127.0.0.3:3260"
	// selfRecovery is how long a session is given to come back by itself
	// once its portal passes again: iscsid 2.1.8 relogs in within 2–6 s,
	// so a session still down after this (two of its 15 s login timeouts)
	// is stuck.
	selfRecovery = 30 * time.Second
)

// makeStuck breaks the proxied portal until the session through it leaves
// LOGGED_IN and the proxy has seen the stuck state's signature (a reopen
// reset after its bind, then three reopens that never got bound: their
// bind failed with ENOTCONN), or for two minutes, then lets the portal
// pass again and waits selfRecovery. It returns false when iscsid
// recovered the session by itself (the stuck state was not reached).
func makeStuck(t *testing.T, sys sysfs.FS, proxy *flakyproxy.Proxy, iqn string) bool {
	t.Helper()
	var bound func() bool
	if s, ok := sessionTo(t, sys, iqn, proxyPortal); ok {
		bound = connBound(sys, s.ID)
	}
	proxy.Break(bound)
	eventually(t, 90*time.Second, "the proxied session to leave LOGGED_IN", func() bool {
		s, ok := sessionTo(t, sys, iqn, proxyPortal)
		return ok && !s.State.LoggedIn()
	})
	_, bound0 := proxy.Resets()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, bound := proxy.Resets(); bound > bound0 && proxy.UnboundRun() >= 3 {
			break
		}
	}
	proxy.Pass()
	deadline := time.Now().Add(selfRecovery)
	for time.Now().Before(deadline) {
		if s, ok := sessionTo(t, sys, iqn, proxyPortal); ok && s.State.LoggedIn() {
			return false
		}
		time.Sleep(time.Second)
	}
	s, _ := sessionTo(t, sys, iqn, proxyPortal)
	all, afterBind := proxy.Resets()
	t.Logf("stuck: %s %s for %s with its portal passing (proxy reset %d connections, %d of them bound)", s.ID, s.State, selfRecovery, all, afterBind)
	return true
}

// stuckOrFail tries up to three times to reach the stuck state.
func stuckOrFail(t *testing.T, sys sysfs.FS, proxy *flakyproxy.Proxy, iqn string) {
	t.Helper()
	for i := 0; i < 3; i++ {
		if makeStuck(t, sys, proxy, iqn) {
			return
		}
		t.Logf("attempt %d: iscsid recovered the session by itself", i+1)
	}
	t.Fatalf("could not reproduce a stuck session (open-iscsi #387) in 3 attempts: iscsid %s recovered each time", "2.1.8")
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
	a, err := p.att.Attach(ctx, driver.AttachRequest{VolumeID: "pv-mp", Context: vc})
	if err != nil {
		t.Fatal(err)
	}
	dev := a.Device
	rec := volume.Record{VolumeID: "pv-mp", Context: vc, Device: dev.Path, AccessType: volume.AccessBlock}
	p.recs.put(rec)
	stuck, _ := sessionTo(t, p.sys, iqn, proxyPortal)

	stuckOrFail(t, p.sys, proxy, iqn)
	if c := p.att.Health(ctx, rec); c.Status != driver.Degraded {
		t.Fatalf("health while stuck: %+v", c)
	}
	start := time.Now()
	reports := healUntil(t, ctx, newHealer(t, p), p, 3*time.Minute, func(rs []iscsi.Report) bool {
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
	eventually(t, 60*time.Second, "Healthy", func() bool { return p.att.Health(ctx, rec).Status == driver.Healthy })
	eventually(t, 60*time.Second, "two paths in the map", func() bool {
		slaves, err := os.ReadDir(filepath.Join("/sys/block", filepath.Base(dev.Path), "slaves"))
		return err == nil && len(slaves) == 2
	})
}

// A stuck session that is the last path of a mounted file system: the
// heal never logs it out; it restarts iscsid, the same disk comes back and
// the file system is still there.
func TestISCSI_HealRestartsIscsidForAStuckLastPath(t *testing.T) {
	l := needLab(t)
	proxy := startFlakyProxy(t, proxyPortal, "127.0.0.2:3260")
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-heal-last"
	lioTarget(t, l, iqn, "e2e-heal-last-lun0", "", "", "127.0.0.2")
	p := newPathmendISCSI(t)
	ctx := context.Background()
	vc := iscsiContext(iqn, 0, "127.0.0.3")
	a, err := p.att.Attach(ctx, driver.AttachRequest{VolumeID: "pv-last", Context: vc})
	if err != nil {
		t.Fatal(err)
	}
	dev := a.Device
	rec := volume.Record{VolumeID: "pv-last", Context: vc, Device: dev.Path, AccessType: volume.AccessMount, FSType: "ext4"}
	p.recs.put(rec)
	mnt := t.TempDir()
	l.sh(t, "mkfs.ext4 -q -F "+dev.Path+" && mount "+dev.Path+" "+mnt+" && echo pathmend >"+mnt+"/proof && sync")
	t.Cleanup(func() { _, _ = l.trySh(t, 30*time.Second, "umount -l "+mnt) })
	before, _ := sessionTo(t, p.sys, iqn, proxyPortal)
	if len(before.LUNs) != 1 || before.LUNs[0].Disk == "" {
		t.Fatalf("session before: %+v", before)
	}

	stuckOrFail(t, p.sys, proxy, iqn)
	if c := p.att.Health(ctx, rec); c.Status != driver.Inaccessible {
		t.Fatalf("health while stuck: %+v", c)
	}
	reports := healUntil(t, ctx, newHealer(t, p), p, 3*time.Minute, func(rs []iscsi.Report) bool {
		_, ok := repairedAt(rs, proxyPortal)
		return ok
	})
	r, _ := repairedAt(reports, proxyPortal)
	t.Logf("repaired by %s; LOGGED_IN %s after the kick", r.Kick, r.TimeToLoggedIn)
	if r.Kick != iscsi.KickRestart {
		t.Errorf("kick %s, want %s: the session is the last path of a mounted disk", r.Kick, iscsi.KickRestart)
	}
	after, _ := sessionTo(t, p.sys, iqn, proxyPortal)
	if after.ID != before.ID || len(after.LUNs) != 1 || after.LUNs[0].Disk != before.LUNs[0].Disk {
		t.Errorf("after the restart: %s %+v, want %s with disk %s kept", after.ID, after.LUNs, before.ID, before.LUNs[0].Disk)
	}
	if got := l.sh(t, "cat "+mnt+"/proof"); got != "pathmend" {
		t.Errorf("file system content after the heal: %q", got)
	}
}
