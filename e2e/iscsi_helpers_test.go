//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/internal/flakyproxy"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// restartIscsid is the guest's iscsid restart (it has no systemd): stop
// the daemon by its pid, wait until it is gone, start it again. The kernel
// sessions stay; the new iscsid adopts and reopens every one of them, as
// `systemctl restart iscsid` does on a node.
const restartIscsid = `pid=$(cat /run/iscsid.pid 2>/dev/null || pgrep -x iscsid)
[ -n "$pid" ] && kill "$pid"
for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
iscsid`

// memRecords is the staged-volume list the attacher and the heal see.
type memRecords struct {
	mu   sync.Mutex
	list []volume.Record
}

func (m *memRecords) List() ([]volume.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.list), nil
}

// put adds a staged record.
func (m *memRecords) put(r volume.Record) {
	r.State = volume.StateStaged
	m.mu.Lock()
	m.list = append(m.list, r)
	m.mu.Unlock()
}

func (m *memRecords) clear() { m.mu.Lock(); m.list = nil; m.mu.Unlock() }

// pathmendISCSI is pathmend's iSCSI stack on the guest's real /sys, /dev,
// iscsiadm and multipath, in this process.
type pathmendISCSI struct {
	sys  sysfs.FS
	in   *iscsi.Initiator
	att  *attach.Attacher
	recs *memRecords
}

func newPathmendISCSI(t *testing.T) *pathmendISCSI {
	t.Helper()
	sys := sysfs.New("/sys")
	in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{
		Exec: exec.New(), Sys: sys, RestartCommand: []string{"bash", "-c", restartIscsid},
	})
	if err != nil {
		t.Fatal(err)
	}
	recs := &memRecords{}
	// The tests' volumes are multipath volumes: the attacher waits for
	// multipathd's map as long as a loaded guest needs (it returns as soon
	// as the map holds every path). pathmend's default, 10 s, is a node's
	// choice between a map and one path; on a guest beside two CPU burners
	// multipathd took longer, and the volume went on one disk.
	att, err := attach.NewAttacher(attach.AttacherConfig{Sys: sys, DevRoot: "/dev", Initiator: in, MultipathWait: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &pathmendISCSI{sys: sys, in: in, att: att, recs: recs}
}

// iscsiContext is the volume context of LUN lun of iqn at portals.
func iscsiContext(iqn string, lun int, portals ...string) volume.Context {
	v := &volume.ISCSI{IQN: iqn, LUN: lun}
	for _, p := range portals {
		v.Portals = append(v.Portals, volume.Endpoint{Host: p, Port: 3260})
	}
	return volume.Context{Transport: volume.TransportISCSI, ISCSI: v}
}

// sessionTo returns the session to iqn through portal (host:port).
func sessionTo(t *testing.T, sys sysfs.FS, iqn, portal string) (iscsi.Session, bool) {
	t.Helper()
	for _, s := range readISCSI(t, sys).SessionsOf(iqn) {
		if s.PortalString() == portal {
			return s, true
		}
	}
	return iscsi.Session{}, false
}

// startFlakyProxy puts a breakable proxy (see internal/flakyproxy) on
// listen in front of the LIO portal target.
func startFlakyProxy(t *testing.T, listen, target string) *flakyproxy.Proxy {
	t.Helper()
	p, err := flakyproxy.Listen(listen, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// connBound is the proxy's break condition for session sid: the kernel
// shows its connection bound.
func connBound(sys sysfs.FS, sid iscsi.SessionID) func() bool {
	rel := "class/iscsi_connection/" + iscsi.ConnectionID{Session: sid}.String() + "/state"
	return func() bool {
		v, err := sys.ReadAttr(rel)
		return err == nil && v == string(iscsi.ConnBound)
	}
}

// lioTarget builds a LIO target with one 64 MiB LUN 0 (backstore name)
// behind the given portals, with CHAP when user is set, and starts iscsid
// and multipathd.
func lioTarget(t *testing.T, l lab, iqn, name, user, pass string, portals ...string) {
	t.Helper()
	script := fmt.Sprintf(`
iqn=%q
lio_target_create "$iqn" 1
dev=$(lab_loop_create %s 64)
lio_backstore_iblock %s "$dev"
lio_lun_add "$iqn" 1 0 %s
`, iqn, name, name, name)
	for _, p := range portals {
		script += fmt.Sprintf("lio_portal_add \"$iqn\" 1 %s\n", p)
	}
	if user != "" {
		script += fmt.Sprintf("lio_chap \"$iqn\" 1 %q %q\n", user, pass)
	}
	script += "lio_tpg_enable \"$iqn\" 1\niscsi_host_start\nmultipathd_start\n"
	l.sh(t, script)
}

// healUntil ticks the heal every second until done returns true or d
// passes, logging every report that carries a verdict.
func healUntil(t *testing.T, ctx context.Context, h *iscsi.SessionHealer, p *pathmendISCSI, d time.Duration, done func([]iscsi.Report) bool) []iscsi.Report {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		snap := readISCSI(t, p.sys)
		recs, _ := p.recs.List()
		reports := h.Tick(ctx, snap, recs, nil)
		for _, r := range reports {
			if r.Verdict != "" {
				t.Logf("heal: %s %s %s %s kick=%s verdict=%s reason=%q err=%v", r.Session, r.Node.Portal, r.State, r.DownFor, r.Kick, r.Verdict, r.Reason, r.Err)
			}
		}
		if done(reports) {
			record(t, kindWait, "the heal to finish", time.Since(start), d)
			return reports
		}
		if time.Now().After(deadline) {
			record(t, kindWait, "the heal to finish", time.Since(start), d)
			t.Fatalf("heal did not finish within %s", d)
		}
		time.Sleep(time.Second)
	}
}

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
