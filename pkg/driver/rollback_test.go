package driver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// A failure after a mount undoes the mount before the RPC answers: one
// test per mount site (NodeStage's mount of the device at the staging
// path, NodePublish's bind at the target path) and per way the call can
// fail after it. The one exception is a mount table that cannot be read
// after the mount: no layer can be told to be the one the call made, so
// none is unmounted; the intent record names the layer the mount shows,
// and the CO's next NodeUnstage or NodeUnpublish releases it.

// faults are the failures a rollback case injects.
type faults struct {
	mu sync.Mutex
	// failPut fails a record write it returns true for.
	failPut func(volume.Record) bool
	// tableFails fails every read of the mount table while set.
	tableFails bool
	// mountThenFail makes the next mount mount, then fail (a remount
	// that failed).
	mountThenFail bool
}

func (f *faults) set(fn func(*faults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

type faultyStore struct {
	*volume.Store
	f *faults
}

func (s faultyStore) Put(r volume.Record) error {
	s.f.mu.Lock()
	fail := s.f.failPut != nil && s.f.failPut(r)
	s.f.mu.Unlock()
	if fail {
		return errors.New("injected: disk full")
	}
	return s.Store.Put(r)
}

type faultyMounter struct {
	*mountstest.Table
	f *faults
}

func (m faultyMounter) after(err error) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err == nil && m.f.mountThenFail {
		m.f.mountThenFail = false
		return errors.New("injected: mount: cannot remount read-only")
	}
	return err
}

func (m faultyMounter) Mount(source, target, fstype string, options []string) error {
	return m.after(m.Table.Mount(source, target, fstype, options))
}

func (m faultyMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	return m.after(m.Table.MountSensitive(source, target, fstype, options, sensitive))
}

// rollbackEnv is a driver over the in-memory table and a store that fail
// on demand.
type rollbackEnv struct {
	drv     *driver.Driver
	tb      *mountstest.Table
	store   *volume.Store
	f       *faults
	dir     string
	staging string
}

func newRollbackEnv(t *testing.T) *rollbackEnv {
	t.Helper()
	dir := t.TempDir()
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	f := &faults{}
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: faultyStore{store, f}})
	if err != nil {
		t.Fatal(err)
	}
	tb := mountstest.New()
	fa := &fakeAttacher{device: filepath.Join(dir, "dev-fake")}
	if err := os.WriteFile(fa.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tools := resizeTools()
	deps := withTable(driver.Deps{
		SysFS: sysfs.New(dir), Intents: owner, Exec: tools,
		Mounter:   &mount.SafeFormatAndMount{Interface: faultyMounter{tb, f}, Exec: tools},
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: fa, volume.TransportISCSI: fa},
	}, tb)
	deps.MountInfo = func() ([]mount.MountInfo, error) {
		f.mu.Lock()
		fail := f.tableFails
		f.mu.Unlock()
		if fail {
			return nil, errors.New("injected: read /proc/self/mountinfo: too many open files")
		}
		return tb.MountInfo()
	}
	d, err := driver.New(testConfig("ext4"), deps)
	if err != nil {
		t.Fatal(err)
	}
	return &rollbackEnv{drv: d, tb: tb, store: store, f: f, dir: dir, staging: mkdir(t, dir, "staging")}
}

func (e *rollbackEnv) stageReq() *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging, VolumeContext: nvmeContext(),
		VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
}

func (e *rollbackEnv) pubReq(target string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging, TargetPath: target,
		VolumeCapability: mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
}

// mountedAt is how many layers the table has at path.
func (e *rollbackEnv) mountedAt(path string) int { return len(e.tb.Snapshot().At(path)) }

func TestRollback_StageMount(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		inject func(*faults)
	}{
		{"the mount fails after it mounted", func(f *faults) { f.mountThenFail = true }},
		{"the staged record cannot be written", func(f *faults) {
			f.failPut = func(r volume.Record) bool { return r.State == volume.StateStaged }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newRollbackEnv(t)
			e.f.set(c.inject)
			_, err := e.drv.NodeStageVolume(ctx, e.stageReq())
			if err == nil {
				t.Fatal("the stage succeeded")
			}
			if n := e.mountedAt(e.staging); n != 0 {
				t.Errorf("%d layers left at the staging path; the stage's mount was not undone: %v", n, e.tb.Log())
			}
			if _, err := e.store.Get("vol-1"); !errors.Is(err, volume.ErrNotFound) {
				t.Errorf("record left after the undone stage: %v", err)
			}
		})
	}
	t.Run("the mount table cannot be read after the mount", func(t *testing.T) {
		t.Parallel()
		e := newRollbackEnv(t)
		e.f.set(func(f *faults) {
			f.failPut = func(r volume.Record) bool {
				// The table fails from the moment the intent to mount is
				// recorded: the read after the mount fails.
				if r.StagingLayer != nil && r.StagingLayer.ID == 0 {
					f.tableFails = true
				}
				return false
			}
		})
		_, err := e.drv.NodeStageVolume(ctx, e.stageReq())
		if err == nil {
			t.Fatal("the stage succeeded")
		}
		if n := e.mountedAt(e.staging); n != 1 {
			t.Fatalf("%d layers at the staging path, want the one the stage made (left: it cannot be told)", n)
		}
		rec, err := e.store.Get("vol-1")
		if err != nil || rec.StagingLayer == nil {
			t.Fatalf("the record does not name the mount it left: %+v, %v", rec.StagingLayer, err)
		}
		e.f.set(func(f *faults) { f.tableFails, f.failPut = false, nil })
		ok(t)(e.drv.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: e.staging}))
		if n := e.mountedAt(e.staging); n != 0 {
			t.Errorf("NodeUnstage left %d layers", n)
		}
	})
}

func TestRollback_PublishBind(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		inject func(*faults)
	}{
		{"the bind fails after it mounted", func(f *faults) { f.mountThenFail = true }},
		{"the publication's layer cannot be recorded", func(f *faults) {
			f.failPut = func(r volume.Record) bool {
				return slices.ContainsFunc(r.Publications, func(p volume.Publication) bool { return p.Layer != nil && p.Layer.ID != 0 })
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newRollbackEnv(t)
			ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
			target := filepath.Join(mkdir(t, e.dir, "pods", "p1"), "mount")
			e.f.set(c.inject)
			_, err := e.drv.NodePublishVolume(ctx, e.pubReq(target))
			if err == nil {
				t.Fatal("the publish succeeded")
			}
			if n := e.mountedAt(target); n != 0 {
				t.Errorf("%d layers left at the target; the bind was not undone: %v", n, e.tb.Log())
			}
			if _, err := os.Stat(target); !os.IsNotExist(err) {
				t.Errorf("the target the publish created is still there: %v", err)
			}
			if n := e.mountedAt(e.staging); n != 1 {
				t.Errorf("%d layers at the staging path, want the staging mount", n)
			}
			e.f.set(func(f *faults) { f.failPut = nil })
			rec, err := e.store.Get("vol-1")
			if err != nil || len(rec.Publications) != 0 {
				t.Errorf("publications left: %+v, %v", rec.Publications, err)
			}
		})
	}
	t.Run("the mount table cannot be read after the bind", func(t *testing.T) {
		t.Parallel()
		e := newRollbackEnv(t)
		ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
		target := filepath.Join(mkdir(t, e.dir, "pods", "p1"), "mount")
		e.f.set(func(f *faults) {
			f.failPut = func(r volume.Record) bool {
				if len(r.Publications) == 1 && r.Publications[0].Layer != nil && r.Publications[0].Layer.ID == 0 {
					f.tableFails = true
				}
				return false
			}
		})
		_, err := e.drv.NodePublishVolume(ctx, e.pubReq(target))
		if err == nil {
			t.Fatal("the publish succeeded")
		}
		if n := e.mountedAt(target); n != 1 {
			t.Fatalf("%d layers at the target, want the bind the publish made (left: it cannot be told)", n)
		}
		e.f.set(func(f *faults) { f.tableFails, f.failPut = false, nil })
		ok(t)(e.drv.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}))
		if n := e.mountedAt(target); n != 0 {
			t.Errorf("NodeUnpublish left %d layers", n)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("the target the publish created is still there: %v", err)
		}
	})
}

// TestRollback_ConfinedTarget: a target that is the kubelet root, an
// ancestor of the staging path, the staging path or a path inside it is
// refused before anything is mounted, and nothing is left behind.
func TestRollback_ConfinedTarget(t *testing.T) {
	ctx := context.Background()
	e := newRollbackEnv(t)
	ok(t)(e.drv.NodeStageVolume(ctx, e.stageReq()))
	for _, target := range []string{e.dir, e.staging, filepath.Join(e.staging, "sub"), filepath.Dir(e.staging)} {
		_, err := e.drv.NodePublishVolume(ctx, e.pubReq(target))
		if code := status.Code(statusOf(err)); code != codes.InvalidArgument && code != codes.FailedPrecondition {
			t.Errorf("publish at %s: %v, want InvalidArgument or FailedPrecondition", target, err)
		}
	}
	for _, l := range e.tb.Log() {
		if strings.HasPrefix(l, "mount ") && !strings.HasSuffix(l, e.staging) {
			t.Errorf("a refused publish mounted: %s", l)
		}
	}
	rec, err := e.store.Get("vol-1")
	if err != nil || len(rec.Publications) != 0 {
		t.Errorf("publications recorded: %+v, %v", rec.Publications, err)
	}
}
