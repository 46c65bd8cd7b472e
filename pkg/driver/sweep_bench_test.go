package driver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	iscsiattach "github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/mounts"
	nvmeattach "github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// sweepNode is a node of staged filesystem volumes as a running plugin
// has it: records on disk, every staging path mounted (the mount table
// says which device each holds), the loop keeping the node model, and
// the driver answering from it.
type sweepNode struct {
	drv *driver.Driver
	mon *monitor.Monitor
	clk *clocktesting.FakeClock
	// bound is the loop's: an entry older than it is not answered from.
	bound time.Duration
	ids   []string
	// staging is the staging path of each volume, by ID.
	staging map[string]string
}

// newSweepNode stages recs (their IDs, contexts and staging paths set)
// on a node whose kernel is sys, with tr the transports of the loop.
func newSweepNode(b testing.TB, sys sysfs.FS, recs []volume.Record, build func(policy *heal.Policy) ([]monitor.Transport, map[volume.Transport]driver.Attacher)) *sweepNode {
	b.Helper()
	dir := b.TempDir()
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		b.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: store, Clock: clk, Runner: func(f func()) { f() }})
	if err != nil {
		b.Fatal(err)
	}
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	n := &sweepNode{staging: map[string]string{}, clk: clk}
	fake := mount.NewFakeMounter(nil)
	byID := map[string]volume.Record{}
	for _, r := range recs {
		r.StagingPath = filepath.Join(dir, "staging", r.VolumeID)
		if err := os.MkdirAll(r.StagingPath, 0o750); err != nil {
			b.Fatal(err)
		}
		r.State, r.AccessType, r.FSType, r.Device = volume.StateStaged, volume.AccessMount, "ext4", "/dev/"+r.VolumeID
		if err := store.Put(r); err != nil {
			b.Fatal(err)
		}
		fake.MountPoints = append(fake.MountPoints, mount.MountPoint{Device: r.Device, Path: r.StagingPath, Type: "ext4"})
		n.ids = append(n.ids, r.VolumeID)
		n.staging[r.VolumeID] = r.StagingPath
		byID[r.VolumeID] = r
	}
	transports, attachers := build(policy)
	mdl := model.New()
	// The mount table (mountinfo, with each mount's device number) is
	// made from the devices the loop's first tick finds.
	// Every mount has its own ID under the namespace's root, as
	// /proc/self/mountinfo lists them: the driver tells a volume's layer
	// by its ID, parent and device.
	var kept *mounts.Table
	table := []mount.MountInfo{{ID: 1, Major: 8, Minor: 1, Root: "/", MountPoint: "/", FsType: "ext4", Source: "/dev/sda1",
		MountOptions: []string{"rw"}, SuperOptions: []string{"rw"}}}
	loop := monitor.Config{}
	n.bound = loop.Bound()
	cfg := testConfig("ext4")
	cfg.HealMode, cfg.HealthBound = heal.ModeRepair, loop.Bound()
	n.drv, err = driver.New(cfg, driver.Deps{
		SysFS: sys, Intents: owner, Exec: fsTools(),
		Mounter:   &mount.SafeFormatAndMount{Interface: fake, Exec: fsTools()},
		Attachers: attachers, Clock: clk, Model: mdl,
		MountInfo: func() ([]mount.MountInfo, error) { return table, nil },
		// The layers as mounts.Kept answers on a node where nothing was
		// mounted since its last read: the same table (what a call of it
		// costs is mounts' BenchmarkKept).
		MountTable: func() (*mounts.Table, error) {
			if kept == nil {
				return mounts.NewTable(table), nil
			}
			return kept, nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	n.mon, err = monitor.New(loop, monitor.Deps{Intents: strictIntents{owner, b}, Transports: transports, Model: mdl, Policy: policy,
		Clock: clk, SysFS: sys, PathExists: func(string) bool { return true }, Staged: n.drv.StagedDevices, Filesystems: n.drv.FilesystemHealth})
	if err != nil {
		b.Fatal(err)
	}
	n.mon.Tick(context.Background())
	for _, v := range mdl.Snapshot().Volumes() {
		if len(v.Devices) == 0 {
			b.Fatalf("volume %s has no device after the first tick: %+v", v.ID, v)
		}
		// The record names the device NodeStage staged, and its number,
		// as NodeStage writes them once the device is known.
		d := v.Devices[0]
		r := byID[v.ID]
		r.Device, r.DevNum = "/dev/"+d.Name, d.Number
		if err := store.Put(r); err != nil {
			b.Fatal(err)
		}
		table = append(table, mount.MountInfo{ID: 30 + len(table), ParentID: 1, Root: "/", MountPoint: n.staging[v.ID], Source: "/dev/" + d.Name, FsType: "ext4",
			MountOptions: []string{"rw"}, SuperOptions: []string{"rw"},
			Major: int(d.Number.Major), Minor: int(d.Number.Minor)})
	}
	kept = mounts.NewTable(table)
	n.mon.Tick(context.Background())
	if got := mdl.Snapshot().Len(); got != len(recs) {
		b.Fatalf("model holds %d volumes, want %d", got, len(recs))
	}
	return n
}

// strictIntents fails the benchmark when a tick starts a job: a healthy
// node's tick has nothing to do.
type strictIntents struct {
	*intent.Owner
	b testing.TB
}

func (s strictIntents) Go(context.Context, volume.Target, string, func(context.Context, *intent.Lease)) (bool, string) {
	s.b.Fatal("a healthy tick started a job")
	return false, ""
}

// sweep is what kubelet sends a node's plugin every minute:
// NodeGetVolumeStats (with its check of a replaced device) and
// NodeGetVolumeHealth for every volume, and one NodeGetStorageHealth.
func (n *sweepNode) sweep(b testing.TB) {
	ctx := context.Background()
	for _, id := range n.ids {
		if _, err := n.drv.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: n.staging[id]}); err != nil {
			b.Fatalf("NodeGetVolumeStats(%s): %v", id, err)
		}
		resp, err := n.drv.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		if err != nil || len(resp.GetVolumeHealth().GetHealthStatuses()) != 0 {
			b.Fatalf("NodeGetVolumeHealth(%s) on a healthy node: %v, %v", id, resp, err)
		}
	}
	resp, err := n.drv.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(resp.GetBackendHealth()) != 0 {
		b.Fatalf("NodeGetStorageHealth on a healthy node: %v, %v", resp, err)
	}
}

// run times b.N sweeps and, after each with the timer stopped, one tick
// of the loop, and reports the sweep's time over the tick's (sweep/tick)
// and the time per RPC (µs/call). With stale set, the clock moves past
// the bound before each sweep, as when the loop is stuck or not running
// (--heal=off): no entry is answered from, and every RPC reads its
// volume's own kernel objects.
func (n *sweepNode) run(b *testing.B, stale bool) {
	var sweeps, ticks time.Duration
	calls := 2*len(n.ids) + 1
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	for b.Loop() {
		if stale {
			b.StopTimer()
			n.clk.Step(n.bound + time.Second)
			b.StartTimer()
		}
		start := time.Now()
		n.sweep(b)
		sweeps += time.Since(start)
		b.StopTimer()
		runtime.GC()
		start = time.Now()
		n.mon.Tick(context.Background())
		ticks += time.Since(start)
		runtime.GC()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(sweeps)/float64(ticks), "sweep/tick")
	b.ReportMetric(float64(sweeps.Microseconds())/float64(b.N*calls), "µs/call")
}

// BenchmarkKubeletSweep is one kubelet sweep of a node through the real
// driver — NodeGetVolumeStats and NodeGetVolumeHealth for every staged
// volume, and one NodeGetStorageHealth — on 1,000 NVMe/TCP volumes × 3
// paths and on 256 iSCSI volumes × 2 portals, healthy, with the loop
// keeping the node model. sweep/tick is the sweep's time over one healthy
// tick's, measured in alternation in the same run (the goal is ≤ 1: a
// sweep costs no more than a tick); µs/call the time of one RPC. The
// past-bound cases sweep with every entry older than the bound: what a
// sweep costs when each RPC reads its own volume's objects.
func BenchmarkKubeletSweep(b *testing.B) {
	// TestKubeletSweep runs the same nodes, small, in every test run.
	b.Run("nvme-1000x3", func(b *testing.B) { nvmeSweepNode(b, 1000, 3).run(b, false) })
	b.Run("iscsi-256x2", func(b *testing.B) { iscsiSweepNode(b, 128, 2).run(b, false) })
	b.Run("nvme-1000x3-past-bound", func(b *testing.B) { nvmeSweepNode(b, 1000, 3).run(b, true) })
	b.Run("iscsi-256x2-past-bound", func(b *testing.B) { iscsiSweepNode(b, 128, 2).run(b, true) })
}

// nvmeSweepNode stages volumes on subsystems of paths live controllers
// each, one namespace per subsystem, their timeouts pathmend's.
func nvmeSweepNode(b testing.TB, volumes, paths int) *sweepNode {
	dir := b.TempDir()
	if err := nvmetest.Healthy(volumes, paths, 1).Write(dir, time.Now()); err != nil {
		b.Fatal(err)
	}
	sys := sysfs.New(dir)
	// As a running plugin leaves them: every controller aligned with the
	// volumes' timeouts.
	ctrls, err := os.ReadDir(filepath.Join(dir, "class/nvme"))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range ctrls {
		for attr, v := range map[string]string{"ctrl_loss_tmo": "off", "reconnect_delay": "5", "fast_io_fail_tmo": "600"} {
			if err := os.WriteFile(filepath.Join(dir, "class/nvme", c.Name(), attr), []byte(v+"\n"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	var recs []volume.Record
	for s := range volumes {
		var eps []string
		for c := range paths {
			eps = append(eps, fmt.Sprintf("192.0.2.1:%d", 4420+c))
		}
		c, _, err := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": fmt.Sprintf("nqn.2024-01.io.pathmend.test:sub-%d", s),
			"endpoints": strings.Join(eps, ","), "optimizedEndpoints": eps[0], "nsid": "1"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, volume.Record{VolumeID: fmt.Sprintf("vol-%04d", s), Context: c})
	}
	host := fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"}
	return newSweepNode(b, sys, recs, func(policy *heal.Policy) ([]monitor.Transport, map[volume.Transport]driver.Attacher) {
		tr, err := nvmeheal.New(nvmeheal.Config{Owned: true}, nvmeheal.Deps{SysFS: sys, Policy: policy, Connector: refusing{b}, Host: host, Prober: reachableProber{}})
		if err != nil {
			b.Fatal(err)
		}
		att, err := nvmeattach.NewAttacher(nvmeattach.AttacherConfig{SysFS: sys, DevRoot: "/dev", Connector: refusing{b}, Host: host, Mender: tr})
		if err != nil {
			b.Fatal(err)
		}
		return []monitor.Transport{tr}, map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: att, volume.TransportISCSI: driver.NotBuilt(volume.TransportISCSI)}
	})
}

// refusing fails the benchmark on any kernel change: the node is healthy.
type refusing struct{ b testing.TB }

func (r refusing) Connect(context.Context, fabrics.Options) (fabrics.Result, error) {
	r.b.Fatal("connect on a healthy node")
	return fabrics.Result{}, nil
}
func (r refusing) Disconnect(string) error { r.b.Fatal("disconnect on a healthy node"); return nil }
func (r refusing) Rescan(string) error     { r.b.Fatal("rescan on a healthy node"); return nil }

// iscsiSweepNode stages luns volumes on each of targets targets, each
// logged in through two portals, one multipath map per LUN over its two
// disks.
func iscsiSweepNode(b testing.TB, targets, luns int) *sweepNode {
	dir := b.TempDir()
	var top iscsitest.Topology
	var recs []volume.Record
	disk := func(n int) string { return fmt.Sprintf("sd%c%c", 'a'+n/26, 'a'+n%26) }
	maps := map[string]*iscsitest.Map{}
	for t := range targets {
		iqn := fmt.Sprintf("iqn.2024-01.io.pathmend.test:t%d", t)
		for p := range 2 {
			n := 2*t + p
			s := iscsitest.Session{ID: n + 1, Host: n, Target: iqn, Address: fmt.Sprintf("192.0.2.%d", p+1), TPGT: 1, RecoveryTmo: 5, Conns: 1}
			for l := range luns {
				wwid := fmt.Sprintf("naa.6001405%021x%04x", t, l)
				d := disk(n*luns + l)
				s.LUNs = append(s.LUNs, iscsitest.LUN{LUN: l, Disk: d, WWID: wwid, Minor: (n*luns + l) % 256})
				m := maps[wwid]
				if m == nil {
					m = &iscsitest.Map{Device: fmt.Sprintf("dm-%d", len(maps)), Name: "3" + wwid[4:]}
					maps[wwid] = m
				}
				m.Slaves = append(m.Slaves, d)
			}
			top.Sessions = append(top.Sessions, s)
		}
		for l := range luns {
			c, _, err := volume.Parse(map[string]string{"transport": "iscsi", "iqn": iqn, "portals": "192.0.2.1,192.0.2.2", "lun": fmt.Sprint(l)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			recs = append(recs, volume.Record{VolumeID: fmt.Sprintf("vol-%03d-%d", t, l), Context: c})
		}
	}
	for _, m := range maps {
		top.Maps = append(top.Maps, *m)
	}
	if err := top.Write(dir); err != nil {
		b.Fatal(err)
	}
	sys := sysfs.New(dir)
	return newSweepNode(b, sys, recs, func(policy *heal.Policy) ([]monitor.Transport, map[volume.Transport]driver.Attacher) {
		healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{Policy: policy, Kicker: benchNoKick{b}, Prober: noProbe{}})
		if err != nil {
			b.Fatal(err)
		}
		tr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sys, Healer: healer})
		if err != nil {
			b.Fatal(err)
		}
		in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: &iscsitest.Exec{Handler: func(context.Context, []string) iscsitest.Result {
			b.Fatal("a command on a healthy node")
			return iscsitest.Result{}
		}}, Sys: sys})
		if err != nil {
			b.Fatal(err)
		}
		att, err := iscsiattach.NewAttacher(iscsiattach.AttacherConfig{Sys: sys, DevRoot: "/dev", Initiator: in, Clocks: healer})
		if err != nil {
			b.Fatal(err)
		}
		return []monitor.Transport{tr}, map[volume.Transport]driver.Attacher{volume.TransportISCSI: att, volume.TransportNVMeTCP: driver.NotBuilt(volume.TransportNVMeTCP)}
	})
}

type benchNoKick struct{ b testing.TB }

func (k benchNoKick) Login(context.Context, iscsi.Node) error { k.b.Fatal("login"); return nil }
func (k benchNoKick) Logout(context.Context, iscsi.Node, iscsi.SessionID) error {
	k.b.Fatal("logout")
	return nil
}
func (k benchNoKick) RestartDaemon(context.Context) error { k.b.Fatal("restart"); return nil }

// TestKubeletSweep runs the benchmark's nodes small, so that a change
// that breaks them is found by every test run, not by the next
// benchmark: every RPC of a sweep of a healthy node answers healthy,
// within the bound (from the model) and past it (each RPC reading its
// own volume's objects), and no tick between starts a job.
func TestKubeletSweep(t *testing.T) {
	for _, c := range []struct {
		name string
		node func(testing.TB) *sweepNode
	}{
		{"nvme", func(tb testing.TB) *sweepNode { return nvmeSweepNode(tb, 12, 3) }},
		{"iscsi", func(tb testing.TB) *sweepNode { return iscsiSweepNode(tb, 4, 2) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := c.node(t)
			for range 2 {
				n.sweep(t)
				n.mon.Tick(context.Background())
			}
			n.clk.Step(n.bound + time.Second)
			n.sweep(t)
		})
	}
}
