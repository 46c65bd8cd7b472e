//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// pathmend's iSCSI attacher against open-iscsi 2.1.8, LIO and multipathd:
// a CHAP volume on two portals attaches as a verified multipath map,
// reports volume.Degraded while a portal is dropped and volume.Healthy again after, and
// detaches without leaving sessions or node records. A wrong CHAP password
// fails the attach and leaves nothing behind either.
func TestISCSI_AttacherStagesAMultipathVolumeWithCHAPAndUnstagesIt(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-attach"
	lioTarget(t, l, iqn, "e2e-attach-lun0", "e2e-user", "e2e-secret-123", "127.0.0.1", "127.0.0.2")
	p := newPathmendISCSI(t)
	ctx := context.Background()
	vc := iscsiContext(iqn, 0, "127.0.0.1", "127.0.0.2")

	// Wrong password: rejected by the target, nothing left behind.
	bad, err := p.att.Attach(ctx, volume.AttachRequest{VolumeID: "pv-bad", Context: vc,
		Secrets: volume.Secrets{CHAPUsername: "e2e-user", CHAPPassword: "not-the-secret"}})
	if !errors.Is(err, iscsi.ErrAuthFailed) {
		t.Fatalf("wrong CHAP password: %v, want ErrAuthFailed", err)
	}
	if strings.Contains(err.Error(), "not-the-secret") {
		t.Fatalf("the secret is in the error: %v", err)
	}
	if err := p.att.Undo(ctx, bad, volume.CoTenants{}); err != nil {
		t.Fatalf("undo of the failed attach: %v", err)
	}
	if out, _ := exec.Command("iscsiadm", "-m", "node").CombinedOutput(); strings.Contains(string(out), iqn) {
		t.Errorf("node records left after a failed attach:\n%s", out)
	}
	if _, ok := sessionTo(t, p.sys, iqn, "127.0.0.1:3260"); ok {
		t.Error("a session is left after a failed attach")
	}

	sec := volume.Secrets{CHAPUsername: "e2e-user", CHAPPassword: "e2e-secret-123"}
	start := time.Now()
	a, err := p.att.Attach(ctx, volume.AttachRequest{VolumeID: "pv-1", Context: vc, Secrets: sec})
	if err != nil {
		t.Fatal(err)
	}
	dev := a.Device
	t.Logf("attached %s (%d bytes) in %s", dev.Path, dev.SizeBytes, time.Since(start).Round(time.Millisecond))
	if !strings.HasPrefix(filepath.Base(dev.Path), "dm-") || dev.SizeBytes != 64<<20 {
		t.Fatalf("device %+v, want a 64 MiB multipath map", dev)
	}
	rec := volume.Record{VolumeID: "pv-1", Context: vc, Device: dev.Path, AccessType: volume.AccessBlock}
	p.recs.put(rec)
	again, err := p.att.Attach(ctx, volume.AttachRequest{VolumeID: "pv-1", Context: vc, Secrets: sec})
	if err != nil || again.Device != dev || again.Created != nil {
		t.Fatalf("second attach: %+v, %v", again, err)
	}
	if c := p.att.Health(ctx, rec); c.Status != volume.Healthy {
		t.Fatalf("health %+v", c)
	}
	out, err := exec.Command("iscsiadm", "-m", "node", "-T", iqn, "-p", "127.0.0.1:3260").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "node.startup = manual") || !strings.Contains(string(out), "node.session.auth.authmethod = CHAP") {
		t.Errorf("node record: %v\n%s", err, out)
	}

	// A dropped portal degrades the volume; restored, it is healthy again.
	l.sh(t, "fault_drop_port 3260 127.0.0.2")
	eventually(t, 4*time.Minute, "Degraded", func() bool { return p.att.Health(ctx, rec).Status == volume.Degraded })
	t.Logf("while dropped: %s", p.att.Health(ctx, rec).Message)
	l.sh(t, "fault_restore_port 3260 127.0.0.2")
	eventually(t, 4*time.Minute, "Healthy", func() bool { return p.att.Health(ctx, rec).Status == volume.Healthy })

	if err := p.att.Detach(ctx, rec, volume.CoTenants{}); err != nil {
		t.Fatal(err)
	}
	p.recs.clear()
	for _, portal := range []string{"127.0.0.1:3260", "127.0.0.2:3260"} {
		if _, ok := sessionTo(t, p.sys, iqn, portal); ok {
			t.Errorf("session through %s left after detach", portal)
		}
	}
	if fileExists("/sys/block/" + filepath.Base(dev.Path)) {
		t.Errorf("map %s left after detach", dev.Path)
	}
	if out, _ := exec.Command("iscsiadm", "-m", "node").CombinedOutput(); strings.Contains(string(out), iqn) {
		t.Errorf("node records left after detach:\n%s", out)
	}
}
