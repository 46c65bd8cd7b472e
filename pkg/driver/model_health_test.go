package driver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// looped is a node whose plugin runs the loop: the driver answers health
// from the node model the loop writes, within the loop's bound.
type looped struct {
	*node
	model *model.Model
	mon   *monitor.Monitor
	drv   *driver.Driver
	bound time.Duration
	// fs is what the loop's read of the staged filesystems finds, by
	// volume ID (the driver's own read finds no filesystem: the mounts
	// are fake).
	fs map[string]fshealth.Health
}

func newLooped(t *testing.T) *looped {
	t.Helper()
	n := newNode(t)
	l := &looped{node: n, model: model.New(), fs: map[string]fshealth.Health{}}
	nvmeTr, err := nvmeheal.New(nvmeheal.Config{Owned: true}, nvmeheal.Deps{
		SysFS: n.kernel.FS(), Policy: n.policy, Connector: n.kernel, Host: testHost, Clock: n.clk, Prober: reachableProber{},
	})
	if err != nil {
		t.Fatal(err)
	}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{Policy: n.policy, Kicker: noKick{t}, Prober: noProbe{}, Now: n.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	iscsiTr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sysfs.New(n.host.Sys), Healer: healer, Clock: n.clk})
	if err != nil {
		t.Fatal(err)
	}
	loop := monitor.Config{Interval: 3 * time.Second}
	l.bound = loop.Bound()
	cfg := testConfig("ext4")
	cfg.HealthBound = l.bound
	ex := fsTools()
	l.drv, err = driver.New(cfg, withTable(driver.Deps{
		SysFS: n.kernel.FS(), Intents: n.owner, Exec: ex,
		Mounter:   &mount.SafeFormatAndMount{Interface: n.mnt, Exec: ex},
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: n.nvmeAtt, volume.TransportISCSI: n.iscsiAtt},
		Clock:     n.clk, Model: l.model,
	}, n.mnt.Table))
	if err != nil {
		t.Fatal(err)
	}
	l.mon, err = monitor.New(loop, monitor.Deps{Intents: n.owner, Transports: []monitor.Transport{nvmeTr, iscsiTr}, Model: l.model,
		Policy: n.policy, Clock: n.clk, SysFS: n.kernel.FS(), PathExists: func(string) bool { return true },
		Filesystems: func(recs []volume.Record) (map[string]fshealth.Health, error) {
			out := map[string]fshealth.Health{}
			for _, r := range recs {
				if h, ok := l.fs[r.VolumeID]; ok {
					out[r.VolumeID] = h
				}
			}
			return out, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	n.drv = l.drv
	return l
}

type noKick struct{ t *testing.T }

func (k noKick) Login(context.Context, iscsi.Node) error { k.t.Error("login"); return nil }
func (k noKick) Logout(context.Context, iscsi.Node, iscsi.SessionID) error {
	k.t.Error("logout")
	return nil
}
func (k noKick) RestartDaemon(context.Context) error { k.t.Error("restart"); return nil }

type noProbe struct{}

func (noProbe) Probe(context.Context, volume.Endpoint) iscsi.Reachability {
	return iscsi.Reachability{ICMP: iscsi.ICMPNotPermitted}
}

// health is the volume's NodeGetVolumeHealth entries.
func (l *looped) health(t *testing.T, id string) []*csi.VolumeHealth_VolumeHealthEntry {
	t.Helper()
	resp, err := l.drv.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolumeHealth().GetHealthStatuses()
}

// TestHealth_NeverStalerThanTheBound: the driver answers health from the
// node model while the volume's entry is at most the bound (two ticks)
// old, and reads the volume's own subsystem beyond it — so a change of
// the kernel shows in NodeGetVolumeHealth, NodeGetStorageHealth and
// NodeGetVolumeStats' health check within the bound with no tick having
// run. A volume the model does not have yet (staged after the last tick)
// is read at once.
func TestHealth_NeverStalerThanTheBound(t *testing.T) {
	l := newLooped(t)
	ctx := context.Background()
	if err := l.stage("pv-1", nvmeVolumeContext(1), true); err != nil {
		t.Fatal(err)
	}
	l.mon.Tick(ctx)
	if v, ok := l.model.Snapshot().Volume("pv-1"); !ok || func() int { n, _ := v.Live(); return n }() != 2 {
		t.Fatalf("model after the tick: %+v", v)
	}
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Fatalf("healthy volume: %v", hs)
	}

	// The kernel deletes the volume's second controller; no tick runs.
	changed := l.clk.Now()
	var gone string
	for _, c := range controllersOf(t, l.node, "127.0.0.2:4420") {
		gone = c
		if err := l.kernel.Disconnect(c); err != nil {
			t.Fatal(err)
		}
	}
	// Within the bound the answer may be the model's: it is, here.
	l.clk.Step(l.bound)
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Fatalf("within the bound, from the model: %v", hs)
	}
	// Past the bound it is the kernel's, read for this volume alone.
	l.clk.Step(time.Millisecond)
	hs := l.health(t, "pv-1")
	if len(hs) != 1 || hs[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED || !strings.Contains(hs[0].GetMessage(), "1 of 2 paths live") {
		t.Fatalf("%s after the change (bound %s), no tick: %v, want DEGRADED 1 of 2 paths live (%s deleted)", l.clk.Since(changed), l.bound, hs, gone)
	}
	sh, err := l.drv.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !hasBackend(sh, csi.StorageHealthErrorType_STORAGE_DEGRADED, "PathsBelowExpected") {
		t.Errorf("storage health past the bound: %v, %v", sh, err)
	}
	if _, ok := l.model.Snapshot().Volume("pv-1"); !ok {
		t.Fatal("the RPC's read dropped the model's entry")
	}
	if v, _ := l.model.Snapshot().Volume("pv-1"); func() int { n, _ := v.Live(); return n }() != 2 {
		t.Errorf("the RPC wrote its read into the model (the loop is its writer): %+v", v)
	}

	// A tick reconnects the path and writes it; the answer is the
	// model's again.
	l.mon.Tick(ctx)
	if v, _ := l.model.Snapshot().Volume("pv-1"); func() int { n, _ := v.Live(); return n }() != 2 || !v.ReadAt.Equal(l.clk.Now()) {
		t.Fatalf("model after the tick that reconnected the path: %+v", v)
	}
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Errorf("after a tick: %v", hs)
	}

	// A volume staged after the last tick is not in the model: read at
	// once.
	if err := l.stage("pv-2", nvmeVolumeContext(2), true); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.model.Snapshot().Volume("pv-2"); ok {
		t.Fatal("pv-2 in the model before a tick")
	}
	if hs := l.health(t, "pv-2"); len(hs) != 0 {
		t.Fatalf("pv-2 just staged (the monitor reconnected nothing yet, the stage connected both): %v", hs)
	}
	for _, c := range controllersOf(t, l.node, "127.0.0.1:4420") {
		if err := l.kernel.Disconnect(c); err != nil {
			t.Fatal(err)
		}
	}
	if hs := l.health(t, "pv-2"); len(hs) != 1 || hs[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED || !strings.Contains(hs[0].GetMessage(), "127.0.0.1:4420: not connected") {
		t.Errorf("pv-2 without one path, not in the model: %v, want DEGRADED at once", hs)
	}
}

// controllersOf lists the controllers of the shared subsystem to
// hostport.
func controllersOf(t *testing.T, n *node, hostport string) []string {
	t.Helper()
	var out []string
	entries, err := os.ReadDir(filepath.Join(n.kernel.FS().Root(), "class/nvme"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		addr, err := n.kernel.FS().ReadAttr("class/nvme/" + e.Name() + "/address")
		if err == nil && strings.Contains(addr, "traddr="+strings.Split(hostport, ":")[0]+",") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestHealth_AnEntryReadBeforeTheStagingIsAnotherStagings: a tick that
// read the node before a restage onto the device that replaced the old
// one wrote what it saw of the old staging; the health RPCs do not answer
// with it, however young it is.
func TestHealth_AnEntryReadBeforeTheStagingIsAnotherStagings(t *testing.T) {
	l := newLooped(t)
	if err := l.stage("pv-1", nvmeVolumeContext(1), true); err != nil {
		t.Fatal(err)
	}
	rec, err := l.store.Get("pv-1")
	if err != nil {
		t.Fatal(err)
	}
	old := l.model.Stamp(l.clk.Now().Add(-time.Second))
	l.model.Update(func(tx *model.Txn) {
		tx.Put(old, model.Volume{ID: "pv-1", Target: rec.Target(), Scope: model.Owned,
			Condition: volume.Condition{Status: volume.Inaccessible, Reason: volume.ReasonStagedDeviceReplaced, Message: "the old staging's device"}})
	})
	if v, ok := l.model.Snapshot().Fresh("pv-1", l.clk.Now(), l.bound); !ok || v.Condition.Reason != volume.ReasonStagedDeviceReplaced {
		t.Fatalf("the model's entry is not the young, stale one: %+v", v)
	}
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Errorf("health of a volume staged after its entry was read: %v, want its own (healthy)", hs)
	}
}

// TestHealth_FilesystemFromTheLoop: the loop reads each staged
// filesystem's health in its tick and writes it into the node model as
// the volume's filesystem fact; within the bound NodeGetVolumeHealth,
// NodeGetStorageHealth and NodeGetVolumeStats answer from it (the
// driver's own read, which would find nothing here, is not made). A fact
// read before the volume was staged as it is now (the filesystem the
// restage checked) is not the new staging's, and a tick that reads it
// healthy clears it.
func TestHealth_FilesystemFromTheLoop(t *testing.T) {
	l := newLooped(t)
	ctx := context.Background()
	if err := l.stage("pv-1", nvmeVolumeContext(1), false); err != nil {
		t.Fatal(err)
	}
	if err := l.stage("pv-2", nvmeVolumeContext(2), false); err != nil {
		t.Fatal(err)
	}
	l.fs["pv-1"] = fshealth.Health{State: fshealth.ReadOnly, FSType: "ext4", Device: "nvme0n1", Errors: 3, Behavior: "remount-ro",
		First: fshealth.ErrorRecord{Time: l.clk.Now().Add(-time.Minute)}, Detail: "errors=remount-ro"}
	l.fs["pv-2"] = fshealth.Health{State: fshealth.Healthy, FSType: "ext4", Device: "nvme0n2"}
	l.mon.Tick(ctx)
	v, _ := l.model.Snapshot().Volume("pv-1")
	if f, ok := v.Facts[fshealth.Fact]; !ok || f.Condition.Reason != fshealth.ReasonReadOnly {
		t.Fatalf("pv-1's facts after the tick: %+v", v.Facts)
	}
	if v, _ := l.model.Snapshot().Volume("pv-2"); len(v.Facts) != 0 {
		t.Errorf("a healthy filesystem has a fact: %+v", v.Facts)
	}

	hs := l.health(t, "pv-1")
	if len(hs) != 1 || hs[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE || hs[0].GetReason() != fshealth.ReasonReadOnly ||
		!strings.Contains(hs[0].GetMessage(), "ext4 on nvme0n1 is read-only after 3 errors") {
		t.Fatalf("NodeGetVolumeHealth(pv-1): %v", hs)
	}
	if hs := l.health(t, "pv-2"); len(hs) != 0 {
		t.Errorf("NodeGetVolumeHealth(pv-2), the co-tenant: %v", hs)
	}
	sh, err := l.drv.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !hasBackend(sh, csi.StorageHealthErrorType_STORAGE_UNREACHABLE, fshealth.ReasonReadOnly) ||
		!strings.Contains(sh.String(), "the filesystem of 1 volume is read-only after errors, every write fails: pv-1;") {
		t.Errorf("NodeGetStorageHealth: %v, %v", sh, err)
	}
	_, err = l.drv.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "pv-1", VolumePath: l.stagingPath("pv-1")})
	wantCode(t, err, codes.FailedPrecondition)

	// Restaged (StagedAt now later than the fact's read): not this
	// staging's, before any tick.
	rec, err := l.store.Get("pv-1")
	if err != nil {
		t.Fatal(err)
	}
	l.clk.Step(time.Second)
	rec.StagedAt = l.clk.Now()
	if err := l.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	// A tick after the restage reads the filesystem again: its fact is
	// this staging's (still read-only in this read) …
	l.mon.Tick(ctx)
	if v, _ := l.model.Snapshot().Volume("pv-1"); v.Facts[fshealth.Fact].ReadAt.Before(rec.StagedAt) {
		t.Fatalf("the tick after the restage did not read the filesystem again: %+v", v.Facts)
	}
	// … and a tick that reads it healthy clears it.
	l.fs["pv-1"] = fshealth.Health{State: fshealth.Healthy, FSType: "ext4", Device: "nvme0n1"}
	l.mon.Tick(ctx)
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Errorf("NodeGetVolumeHealth(pv-1) after the restage and a healthy read: %v", hs)
	}
	if v, _ := l.model.Snapshot().Volume("pv-1"); len(v.Facts) != 0 {
		t.Errorf("a healthy read left the fact: %+v", v.Facts)
	}

	// An old fact (read before the staging) is dropped by the RPC even
	// while the entry is young.
	old := l.clk.Now().Add(-time.Hour)
	l.model.Update(func(tx *model.Txn) {
		tx.SetFact("pv-1", fshealth.Fact, model.Fact{Condition: volume.Condition{Status: volume.Inaccessible, Reason: fshealth.ReasonReadOnly, Message: "an old staging's"}, ReadAt: old})
	})
	if hs := l.health(t, "pv-1"); len(hs) != 0 {
		t.Errorf("a fact read before the staging answered: %v", hs)
	}
}
