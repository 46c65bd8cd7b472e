package driver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// gateMounter is a fake mounter whose unmounts can be held in the
// "kernel" until the test lets them through, and that counts them.
type gateMounter struct {
	*mount.FakeMounter
	mu       sync.Mutex
	hold     chan struct{} // non-nil: Unmount waits for it to close
	entered  chan string
	unmounts []string
}

func (g *gateMounter) Unmount(target string) error {
	g.mu.Lock()
	hold := g.hold
	g.unmounts = append(g.unmounts, target)
	g.mu.Unlock()
	if hold != nil {
		g.entered <- target
		<-hold
	}
	return g.FakeMounter.Unmount(target)
}

func (g *gateMounter) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.unmounts)
}

// stallEnv is a driver over fakes shaped as a node where volume "vol-a",
// ext4 on nvme0n1 (259:1), is staged and published: a sysfs tree with the
// device, a mount table with the staging mount and the publication's
// bind, a fake mounter that knows both mounts, a fake attacher whose path
// health the test sets.
type stallEnv struct {
	d        *driver.Driver
	model    *model.Model
	att      *fakeAttacher
	mnt      *gateMounter
	clk      *clocktesting.FakeClock
	staging  string
	target   string
	sys      string
	superOpt string // the staging mount's superblock options
	mounted  map[string]bool
}

func newStallEnv(t *testing.T) *stallEnv {
	t.Helper()
	dir := t.TempDir()
	e := &stallEnv{staging: mkdir(t, dir, "staging"), target: mkdir(t, dir, "pods", "a"), sys: filepath.Join(dir, "sys"), superOpt: "rw,errors=remount-ro",
		clk: clocktesting.NewFakeClock(time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)), model: model.New()}
	e.mounted = map[string]bool{e.staging: true, e.target: true}
	mkdir(t, e.sys, "devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1")
	mkdir(t, e.sys, "dev/block")
	if err := os.Symlink("../../devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1", filepath.Join(e.sys, "dev/block/259:1")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, e.sys, "fs/ext4/nvme0n1")
	for k, v := range map[string]string{"errors_count": "0", "delayed_allocation_blocks": "2048"} {
		if err := os.WriteFile(filepath.Join(e.sys, "fs/ext4/nvme0n1", k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	e.att = &fakeAttacher{device: "/dev/nvme0n1"}
	e.att.health = func(volume.Record) volume.Condition {
		return volume.Condition{Status: volume.Inaccessible, Reason: "NoLivePath", Message: "0 of 2 paths live; nvme0 connecting; nvme1 connecting"}
	}
	fm := mount.NewFakeMounter([]mount.MountPoint{{Device: "/dev/nvme0n1", Path: e.staging, Type: "ext4"}, {Device: "/dev/nvme0n1", Path: e.target, Type: "ext4"}})
	e.mnt = &gateMounter{FakeMounter: fm, entered: make(chan string, 4)}
	for _, c := range []string{"nvme0", "nvme1"} {
		e.setFastIOFail(t, c, "600")
	}
	cfg := testConfig("ext4")
	cfg.KernelCallTimeout = 10 * time.Second
	cfg.HealthBound = 7200 * time.Millisecond
	e.d, err = driver.New(cfg, driver.Deps{
		SysFS: sysfs.New(e.sys), Intents: ownerOf(t, store), Exec: utilexec.New(),
		Mounter:   &mount.SafeFormatAndMount{Interface: e.mnt, Exec: utilexec.New()},
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: e.att, volume.TransportISCSI: e.att},
		Clock:     e.clk,
		MountInfo: e.mountInfo,
		// The fake kernel unmounts a layer at its mount point, through
		// the gate.
		UnmountLayer:   func(l mounts.Layer) error { return e.mnt.Unmount(l.MountPoint) },
		MountNamespace: func() (mounts.Namespace, error) { return mounts.Namespace{Boot: "boot-1", Mount: "mnt:[1]"}, nil },
		Model:          e.model,
	})
	if err != nil {
		t.Fatal(err)
	}
	vc, _, err := volume.ParseWithPublish(nvmeContext(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := volume.Record{VolumeID: "vol-a", Context: vc, StagingPath: e.staging, AccessType: volume.AccessMount, FSType: "ext4",
		Device: "/dev/nvme0n1", DevNum: volume.DeviceNumber{Major: 259, Minor: 1}, State: volume.StateStaged, StagedAt: e.clk.Now().Add(-time.Hour),
		Publications: []volume.Publication{{TargetPath: e.target}}}
	if err := store.Put(rec); err != nil {
		t.Fatal(err)
	}
	return e
}

// setFastIOFail writes class/nvme/<ctrl>/fast_io_fail_tmo.
func (e *stallEnv) setFastIOFail(t *testing.T, ctrl, v string) {
	t.Helper()
	mkdir(t, e.sys, "class/nvme", ctrl)
	if err := os.WriteFile(filepath.Join(e.sys, "class/nvme", ctrl, "fast_io_fail_tmo"), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// pathsDownSince writes vol-a into the node model as the loop would see
// it with both controllers reconnecting since at.
func (e *stallEnv) pathsDownSince(t *testing.T, at time.Time) {
	t.Helper()
	rec := volume.Record{VolumeID: "vol-a", Context: mustContext(t)}
	// The first read that saw them down, and the last tick's.
	for _, read := range []time.Time{at, e.clk.Now()} {
		st := e.model.Stamp(read)
		e.model.Update(func(tx *model.Txn) {
			tx.Put(st, model.Volume{ID: "vol-a", Target: rec.Target(), Scope: model.Owned,
				Condition: volume.Condition{Status: volume.Inaccessible, Reason: "NoLivePath", Message: "0 of 2 paths live"},
				Paths: []model.Path{
					{Endpoint: "127.0.0.1:4420", Object: "nvme0", State: model.PathDown, Detail: "nvme0 connecting"},
					{Endpoint: "127.0.0.2:4420", Object: "nvme1", State: model.PathDown, Detail: "nvme1 connecting"},
				}})
		})
	}
}

func mustContext(t *testing.T) volume.Context {
	t.Helper()
	vc, _, err := volume.ParseWithPublish(nvmeContext(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return vc
}

// mountInfo is the mount table of what is mounted now, as mountinfo
// shows an ext4 on nvme0n1 and a bind of it.
func (e *stallEnv) mountInfo() ([]mount.MountInfo, error) {
	out := []mount.MountInfo{{ID: 1, ParentID: 0, Major: 8, Minor: 1, Root: "/", MountPoint: "/", FsType: "ext4", Source: "/dev/sda1", MountOptions: []string{"rw"}, SuperOptions: []string{"rw"}}}
	for _, mp := range e.mnt.FakeMounter.MountPoints {
		out = append(out, mount.MountInfo{ID: 30 + len(out), ParentID: 1, Major: 259, Minor: 1, Root: "/", MountPoint: mp.Path, FsType: "ext4", Source: "/dev/nvme0n1",
			MountOptions: []string{"rw", "relatime"}, SuperOptions: strings.Split(e.superOpt, ",")})
	}
	return out, nil
}

func (e *stallEnv) unmount(t *testing.T, path string) {
	t.Helper()
	if err := e.mnt.FakeMounter.Unmount(path); err != nil {
		t.Fatal(err)
	}
}

func (e *stallEnv) unstage() error {
	_, err := e.d.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: "vol-a", StagingTargetPath: e.staging})
	return err
}

func wantUnavailableNaming(t *testing.T, what string, err error, subs ...string) {
	t.Helper()
	st := status.Convert(statusOf(err))
	if st.Code() != codes.Unavailable {
		t.Fatalf("%s: %v, want Unavailable", what, err)
	}
	for _, s := range subs {
		if !strings.Contains(st.Message(), s) {
			t.Errorf("%s: message lacks %q: %s", what, s, st.Message())
		}
	}
}

// With every path down and the filesystem mounted read-write, nothing
// that would wait in the kernel is started: NodeUnstage, NodeGetVolumeStats
// and NodeExpandVolume answer Unavailable at once, naming the paths, the
// filesystem, its unwritten data and what to do; no unmount and no
// rescan is started. NodeUnpublish of a bind mount (the staging mount
// still holds the filesystem) is not held up. Once a path is live the
// same NodeUnstage goes through.
func TestStall_NothingWaitsInTheKernelWhileNoPathIsLive(t *testing.T) {
	e := newStallEnv(t)
	ctx := context.Background()
	ok(t)(e.d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-a", TargetPath: e.target}))
	if e.mnt.count() != 1 {
		t.Fatalf("NodeUnpublish of a bind whose filesystem stays mounted: %d unmounts, want 1", e.mnt.count())
	}

	// Before the loop saw the paths down, the message says so.
	err := e.unstage()
	wantUnavailableNaming(t, "NodeUnstage", err, "volume vol-a: every path is down (since less than a monitor tick ago) (0 of 2 paths live; nvme0 connecting")
	// The loop saw them down 3 minutes ago: since when, and when the
	// kernel stops queueing (fast_io_fail_tmo after that).
	e.pathsDownSince(t, e.clk.Now().Add(-3*time.Minute))
	err = e.unstage()
	wantUnavailableNaming(t, "NodeUnstage", err, "volume vol-a: every path is down since 2026-12-04T16:57:00Z (3m0s ago) (0 of 2 paths live; nvme0 connecting", "ext4 on nvme0n1 (259:1) is mounted read-write at "+e.staging,
		"8.0 MiB of ext4 delayed-allocation data not yet written", "an unmount would wait in the kernel", "until a path returns or NVMe fast_io_fail_tmo (600 s) expires at 2026-12-04T17:07:00Z",
		"Nothing was started", "docs/operations.md#every-path-of-a-volume-is-down")
	_, err = e.d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-a", VolumePath: e.staging})
	wantUnavailableNaming(t, "NodeGetVolumeStats", err, "a statfs would wait")
	_, err = e.d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-a", VolumePath: e.staging})
	wantUnavailableNaming(t, "NodeExpandVolume", err, "a grow of the filesystem would wait")
	if e.mnt.count() != 1 || strings.Contains(strings.Join(e.att.Calls(), " "), "expand") {
		t.Errorf("started while no path is live: unmounts %d, attacher %v", e.mnt.count(), e.att.Calls())
	}

	// A path is back: the retry unstages.
	e.att.health = func(volume.Record) volume.Condition {
		return volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: "1 of 2 paths live"}
	}
	if err := e.unstage(); err != nil {
		t.Fatalf("NodeUnstage with a live path: %v", err)
	}
}

// Once every controller's fast_io_fail_tmo has run out (from when the
// loop saw its path down, plus a health bound), the kernel fails the
// volume's I/O at once: the unmount cannot wait, and the unstage is
// started. With fast_io_fail_tmo off it never runs out.
func TestStall_PastFastIOFailTmoTheUnmountIsStarted(t *testing.T) {
	t.Run("expired", func(t *testing.T) {
		e := newStallEnv(t)
		e.unmount(t, e.target)
		e.setFastIOFail(t, "nvme1", "30")
		e.pathsDownSince(t, e.clk.Now().Add(-35*time.Second))
		// nvme0 queues for 600 s: until 17:09:25.
		wantUnavailableNaming(t, "NodeUnstage before the end", e.unstage(), "NVMe fast_io_fail_tmo (30, 600 s) expires at 2026-12-04T17:09:25Z")
		// Both 30 s: the end was 16:59:55, but the bound (7.2 s) is not
		// over yet.
		e.setFastIOFail(t, "nvme0", "30")
		wantUnavailableNaming(t, "NodeUnstage within the bound past the end", e.unstage(), "NVMe fast_io_fail_tmo (30 s) expires at 2026-12-04T16:59:55Z")
		e.clk.Step(3 * time.Second)
		if err := e.unstage(); err != nil {
			t.Fatalf("NodeUnstage once the kernel fails the I/O: %v", err)
		}
		if e.mnt.count() != 1 {
			t.Errorf("%d unmounts, want 1", e.mnt.count())
		}
	})
	t.Run("off", func(t *testing.T) {
		e := newStallEnv(t)
		e.unmount(t, e.target)
		e.setFastIOFail(t, "nvme1", "off")
		e.pathsDownSince(t, e.clk.Now().Add(-time.Hour))
		wantUnavailableNaming(t, "NodeUnstage", e.unstage(), "until a path returns (never: fast_io_fail_tmo is off on nvme1")
		if e.mnt.count() != 0 {
			t.Errorf("%d unmounts started", e.mnt.count())
		}
	})
}

// What cannot wait is started with every path down: a read-only
// superblock (nothing written at unmount), a device the kernel no longer
// has (every I/O fails at once), and the unmount of a bind that is the
// filesystem's last mount is held like the staging mount's.
func TestStall_WhatCannotWaitIsStarted(t *testing.T) {
	t.Run("read-only superblock", func(t *testing.T) {
		e := newStallEnv(t)
		e.superOpt = "ro"
		e.unmount(t, e.target)
		if err := e.unstage(); err != nil {
			t.Errorf("NodeUnstage of a read-only filesystem with no path: %v", err)
		}
	})
	t.Run("device removed", func(t *testing.T) {
		e := newStallEnv(t)
		e.unmount(t, e.target)
		if err := os.Remove(filepath.Join(e.sys, "dev/block/259:1")); err != nil {
			t.Fatal(err)
		}
		if err := e.unstage(); err != nil {
			t.Errorf("NodeUnstage of a filesystem on a removed device: %v", err)
		}
	})
	t.Run("a publication that is the last mount", func(t *testing.T) {
		e := newStallEnv(t)
		e.unmount(t, e.staging)
		_, err := e.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-a", TargetPath: e.target})
		wantUnavailableNaming(t, "NodeUnpublish of the last mount", err, "mounted read-write at "+e.target)
		if e.mnt.count() != 0 {
			t.Errorf("%d unmounts started", e.mnt.count())
		}
	})
}

// A path lost during the unmount: the RPC answers Aborted at the bound,
// naming the call; every RPC on the volume meanwhile answers Aborted at
// once without starting anything; when the unmount returns, the retry
// finishes the unstage.
func TestStall_AnUnmountLeftInTheKernelKeepsTheVolumeBusy(t *testing.T) {
	e := newStallEnv(t)
	e.unmount(t, e.target)
	e.att.health = func(volume.Record) volume.Condition {
		return volume.Condition{Status: volume.Healthy, Message: "2 of 2 paths live"}
	}
	e.mnt.mu.Lock()
	e.mnt.hold = make(chan struct{})
	e.mnt.mu.Unlock()
	answered := make(chan error, 1)
	go func() { answered <- e.unstage() }()
	<-e.mnt.entered
	for !e.clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	e.clk.Step(10 * time.Second)
	err := <-answered
	if st := status.Convert(statusOf(err)); st.Code() != codes.Aborted || !strings.Contains(st.Message(), "the unmount of "+e.staging+" has been waiting in the kernel since 2026-12-04T17:00:00Z") {
		t.Fatalf("NodeUnstage past the bound: %v", err)
	}
	// Busy: nothing else starts, on any RPC.
	wantCode(t, e.unstage(), codes.Aborted)
	_, err = e.d.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-a", VolumePath: e.staging})
	wantCode(t, err, codes.Aborted)
	_, err = e.d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: "vol-a", StagingTargetPath: e.staging, TargetPath: e.target,
		VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
	wantCode(t, err, codes.Aborted)
	if n := e.mnt.count(); n != 1 {
		t.Errorf("%d unmounts started, want the one in the kernel", n)
	}

	e.mnt.mu.Lock()
	close(e.mnt.hold)
	e.mnt.hold = nil
	e.mnt.mu.Unlock()
	deadline := time.Now().Add(time.Minute)
	for {
		err := e.unstage()
		if err == nil {
			break
		}
		if status.Code(statusOf(err)) != codes.Aborted || time.Now().After(deadline) {
			t.Fatalf("NodeUnstage after the unmount returned: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	if calls := strings.Join(e.att.Calls(), " "); !strings.Contains(calls, "detach vol-a") {
		t.Errorf("the retried unstage did not detach: %v", calls)
	}
}
