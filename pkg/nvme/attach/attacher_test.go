package attach_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

const testNQN = "nqn.2014-08.io.pathmend.test:shared"

// rig is an attacher on a fake kernel with a fake clock.
type rig struct {
	k       *nvmetest.Kernel
	clk     *clocktesting.FakeClock
	att     *attach.Attacher
	records []volume.Record
}

func newRig(t *testing.T) *rig {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	k := nvmetest.NewKernel(t.TempDir(), clk)
	k.AddTarget(nvmetest.SharedTarget(testNQN))
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{k: k, clk: clk}
	r.att, err = attach.NewAttacher(attach.AttacherConfig{
		SysFS: k.FS(), DevRoot: "/dev", Connector: k, Policy: policy,
		Host:       fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"},
		AttachWait: 300 * time.Millisecond, Poll: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func nvmeVolume(nsid uint32) volume.Context {
	return volume.Context{Transport: volume.TransportNVMeTCP, NVMe: &volume.NVMeTCP{
		NQN:                testNQN,
		Endpoints:          []volume.Endpoint{{Host: "127.0.0.2", Port: 4420}, {Host: "127.0.0.1", Port: 4420}},
		OptimizedEndpoints: []volume.Endpoint{{Host: "127.0.0.1", Port: 4420}},
		NSID:               nsid,
	}}
}

// attach attaches volume id with the rig's records as co-tenants.
func (r *rig) attach(t *testing.T, id string, nsid uint32) (volume.Device, error) {
	t.Helper()
	a, err := r.attachment(t, id, nsid)
	return a.Device, err
}

func (r *rig) attachment(t *testing.T, id string, nsid uint32) (volume.Attachment, error) {
	t.Helper()
	return r.att.Attach(context.Background(), volume.AttachRequest{VolumeID: id, Context: nvmeVolume(nsid), CoTenants: r.co(id)})
}

// co returns the rig's records but volumeID's.
func (r *rig) co(volumeID string) volume.CoTenants {
	var co volume.CoTenants
	for _, x := range r.records {
		if x.VolumeID != volumeID {
			co.Records = append(co.Records, x)
		}
	}
	return co
}

// preconnect makes the kernel already hold controllers to both ports, an
// hour old — the state a previous attach or a node's boot left behind.
func (r *rig) preconnect(t *testing.T) {
	t.Helper()
	for _, addr := range []string{"127.0.0.1", "127.0.0.2"} {
		if _, err := r.k.Connect(context.Background(), fabrics.Options{Transport: "tcp", Traddr: addr, Trsvcid: "4420", NQN: testNQN}); err != nil {
			t.Fatal(err)
		}
	}
	r.clk.Step(time.Hour)
	r.k.Refresh()
}

func TestAttach_TwoPathsOptimizedFirst(t *testing.T) {
	r := newRig(t)
	dev, err := r.attach(t, "vol-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if dev.Path != filepath.Join("/dev", "nvme0n1") || dev.SizeBytes != 131072*512 {
		t.Errorf("device = %+v", dev)
	}
	want := []string{"connect 127.0.0.1:4420", "connect 127.0.0.2:4420"}
	if diff := cmp.Diff(want, r.k.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	// Attach again: everything is present, nothing is connected twice.
	if _, err := r.attach(t, "vol-1", 1); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, r.k.Calls()); diff != "" {
		t.Errorf("second attach connected again (-want +got):\n%s", diff)
	}
	r.records = []volume.Record{{VolumeID: "vol-1", Context: nvmeVolume(1)}}
	if c := r.att.Health(context.Background(), r.records[0]); c.Status != volume.Healthy || c.Message != "2 of 2 paths live" {
		t.Errorf("health = %+v", c)
	}
}

// TestAttach_AlreadyConnectedButNoNamespaceIsRepairedOnce: controllers are
// live but the subsystem exports no namespace, so connecting again says
// "already connected" and no device ever appears. NodeStage repairs once
// and reconnects, and ends with a usable device.
func TestAttach_AlreadyConnectedButNoNamespaceIsRepairedOnce(t *testing.T) {
	r := newRig(t)
	r.preconnect(t)
	r.k.DropLegs(0)
	r.k.DropLegs(1)
	dev, err := r.attach(t, "vol-1", 1)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if !strings.HasPrefix(dev.Path, "/dev/nvme0n") {
		t.Errorf("device = %+v", dev)
	}
	want := []string{
		"connect 127.0.0.1:4420", "connect 127.0.0.2:4420", // the earlier, broken attach
		"delete nvme0", "delete nvme1", // the repair
		"connect 127.0.0.1:4420", "connect 127.0.0.2:4420", // the one retry
	}
	if diff := cmp.Diff(want, r.k.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestAttach_ControllerNotContributingIsReplaced(t *testing.T) {
	r := newRig(t)
	r.preconnect(t)
	r.k.DropLegs(1) // nvme1 (127.0.0.2) live without a leg
	if _, err := r.attach(t, "vol-1", 1); err != nil {
		t.Fatal(err)
	}
	calls := r.k.Calls()[2:]
	want := []string{"delete nvme1", "connect 127.0.0.2:4420"}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("calls after preconnect (-want +got):\n%s", diff)
	}
	r.records = []volume.Record{{VolumeID: "vol-1", Context: nvmeVolume(1)}}
	if c := r.att.Health(context.Background(), r.records[0]); c.Status != volume.Healthy {
		t.Errorf("health after repair = %+v", c)
	}
}

// TestAttach_YoungControllerIsLeftAlone: a controller connected 97 ms ago
// that has not attached its leg yet is not torn down; the volume attaches
// over the other path and the condition says why it is short.
func TestAttach_YoungControllerIsLeftAlone(t *testing.T) {
	r := newRig(t)
	r.k.DropLegs(1)
	if _, err := r.attach(t, "vol-1", 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range r.k.Calls() {
		if strings.HasPrefix(c, "delete") {
			t.Fatalf("young controller torn down: %v", r.k.Calls())
		}
	}
	c := r.att.Health(context.Background(), volume.Record{VolumeID: "vol-1", Context: nvmeVolume(1)})
	if c.Status != volume.Degraded || !strings.Contains(c.Message, "1 of 2 paths live; 127.0.0.2:4420: nvme1 contributes no path") {
		t.Errorf("health = %+v", c)
	}
}

func TestAttach_UnreachablePaths(t *testing.T) {
	r := newRig(t)
	r.k.SetUnreachable("127.0.0.2:4420", true)
	if _, err := r.attach(t, "vol-1", 1); err != nil {
		t.Fatalf("one path down: %v", err)
	}
	r2 := newRig(t)
	r2.k.SetUnreachable("127.0.0.1:4420", true)
	r2.k.SetUnreachable("127.0.0.2:4420", true)
	_, err := r2.attach(t, "vol-1", 1)
	if !errors.Is(err, attach.ErrNoPath) || !errors.Is(err, fabrics.ErrUnreachable) {
		t.Errorf("both paths down: %v", err)
	}
}

// TestDetach_LeavesControllersAStagedCoTenantStillUses: two volumes are
// namespaces of one subsystem; unstaging one keeps the shared controllers.
func TestDetach_LeavesControllersAStagedCoTenantStillUses(t *testing.T) {
	r := newRig(t)
	for _, ns := range []uint32{1, 2} {
		if _, err := r.attach(t, "vol-"+string(rune('0'+ns)), ns); err != nil {
			t.Fatal(err)
		}
	}
	v1 := volume.Record{VolumeID: "vol-1", Context: nvmeVolume(1)}
	v2 := volume.Record{VolumeID: "vol-2", Context: nvmeVolume(2)}
	r.records = []volume.Record{v1, v2}
	before := len(r.k.Calls())
	if err := r.att.Detach(context.Background(), v1, r.co("vol-1")); err != nil {
		t.Fatal(err)
	}
	if len(r.k.Calls()) != before {
		t.Fatalf("detach with a staged co-tenant tore down: %v", r.k.Calls()[before:])
	}
	r.records = []volume.Record{v2}
	if err := r.att.Detach(context.Background(), v2, r.co("vol-2")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete nvme1", "delete nvme0"}, r.k.Calls()[before:]); diff != "" {
		t.Errorf("last volume's detach (-want +got):\n%s", diff)
	}
}

func TestConditionOf(t *testing.T) {
	for _, tc := range []struct {
		r    nvme.PathReport
		want volume.HealthStatus
	}{
		{nvme.PathReport{Expected: 3, Live: 3, Optimized: 1}, volume.Healthy},
		{nvme.PathReport{Expected: 3, Live: 2, Problems: []string{"x"}}, volume.Degraded},
		{nvme.PathReport{Expected: 2, Live: 0}, volume.Inaccessible},
	} {
		if got := nvme.ConditionOf(tc.r); got.Status != tc.want {
			t.Errorf("ConditionOf(%+v) = %+v, want %v", tc.r, got, tc.want)
		}
	}
}

// TestAttach_FailureRollsBackItsConnects: the subsystem exports nothing;
// the attach fails as Unavailable naming the controllers it connected,
// and Undo disconnects exactly those.
func TestAttach_FailureRollsBackItsConnects(t *testing.T) {
	r := newRig(t)
	r.k.SetNamespaceEnabled(testNQN, 1, false)
	r.k.SetNamespaceEnabled(testNQN, 2, false)
	a, err := r.attachment(t, "vol-1", 1)
	if !errors.Is(err, volume.ErrUnavailable) || !errors.Is(err, nvme.ErrNamespaceNotFound) {
		t.Fatalf("err = %v, want ErrUnavailable wrapping ErrNamespaceNotFound", err)
	}
	if a.Created == nil || a.Created.String() != "controllers nvme0,nvme1" {
		t.Fatalf("created = %v, want controllers nvme0,nvme1", a.Created)
	}
	if err := r.att.Undo(context.Background(), a, r.co("vol-1")); err != nil {
		t.Fatal(err)
	}
	want := []string{"connect 127.0.0.1:4420", "connect 127.0.0.2:4420", "delete nvme0", "delete nvme1"}
	if diff := cmp.Diff(want, r.k.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	// With another volume in the subsystem, its paths stay.
	r2 := newRig(t)
	r2.records = []volume.Record{{VolumeID: "vol-2", Context: nvmeVolume(2)}}
	r2.k.SetNamespaceEnabled(testNQN, 1, false)
	a, err = r2.attachment(t, "vol-1", 1)
	if err == nil {
		t.Fatal("attach of a missing namespace succeeded")
	}
	if err := r2.att.Undo(context.Background(), a, r2.co("vol-1")); err != nil {
		t.Fatal(err)
	}
	for _, c := range r2.k.Calls() {
		if strings.HasPrefix(c, "delete") {
			t.Errorf("rolled back controllers a staged co-tenant uses: %v", r2.k.Calls())
		}
	}
}

// Health names the namespace's device as the kernel has it now, by name
// and number: Attach's device while it lasts; after the namespace was
// disabled and enabled on the target, a new head with a new number — what
// the driver compares with the staged device.
func TestHealth_ReportsTheNamespacesCurrentDevice(t *testing.T) {
	r := newRig(t)
	dev, err := r.attach(t, "vol-2", 2)
	if err != nil {
		t.Fatal(err)
	}
	rec := volume.Record{VolumeID: "vol-2", Context: nvmeVolume(2), Device: dev.Path, DevNum: dev.Number}
	c := r.att.Health(context.Background(), rec)
	want := []volume.BlockDevice{{Name: filepath.Base(dev.Path), Number: dev.Number}}
	if dev.Number.IsZero() || c.Status != volume.Healthy || !cmp.Equal(c.Devices, want) {
		t.Fatalf("attached %+v; health %+v", dev, c)
	}
	r.k.SetNamespaceEnabled(testNQN, 2, false)
	if c := r.att.Health(context.Background(), rec); c.Status != volume.Inaccessible || len(c.Devices) != 0 {
		t.Fatalf("namespace disabled: %+v", c)
	}
	r.k.SetNamespaceEnabled(testNQN, 2, true)
	c = r.att.Health(context.Background(), rec)
	if c.Status != volume.Healthy || len(c.Devices) != 1 || c.Devices[0].Name == want[0].Name || c.Devices[0].Number == dev.Number {
		t.Fatalf("namespace back: %+v, was %+v", c, want)
	}
	if _, replaced := volume.Replaced(rec, volume.StagedDevice{Device: want[0], From: "the record"}, c.Devices, true); !replaced {
		t.Error("the new head does not replace the staged one")
	}
}

// TestUndo_TakesOnlyItsOwnControllers: Undo keeps everything while a
// record that may be the subsystem's cannot be read, and never deletes a
// controller whose name the kernel has since given to another subsystem.
func TestUndo_TakesOnlyItsOwnControllers(t *testing.T) {
	r := newRig(t)
	r.k.SetNamespaceEnabled(testNQN, 1, false)
	r.k.SetNamespaceEnabled(testNQN, 2, false)
	a, err := r.attachment(t, "vol-1", 1)
	if err == nil {
		t.Fatal("attach of a missing namespace succeeded")
	}
	blocked := volume.CoTenants{Unreadable: []*volume.RecordError{{Path: "/state/volumes/vol-x.json", Err: errors.New("written by a newer pathmend (version 3)")}}}
	before := len(r.k.Calls())
	if err := r.att.Undo(context.Background(), a, blocked); !errors.Is(err, volume.ErrTeardownBlocked) {
		t.Fatalf("Undo with an unreadable record: %v, want blocked", err)
	}
	if calls := r.k.Calls()[before:]; len(calls) != 0 {
		t.Fatalf("Undo tore down %v while blocked", calls)
	}

	// nvme0 goes away on its own and its name is given to a controller of
	// another subsystem; Undo removes only nvme1.
	if err := r.k.Disconnect("nvme0"); err != nil {
		t.Fatal(err)
	}
	const other = "nqn.2014-08.io.pathmend.test:other"
	r.k.AddTarget(nvmetest.Target{NQN: other, Namespaces: []nvmetest.Namespace{{Head: 1, NSID: 1}}, Ports: map[string]string{"127.0.0.9:4420": "optimized"}})
	r.k.Reuse(0)
	if _, err := r.k.Connect(context.Background(), fabrics.Options{Transport: "tcp", Traddr: "127.0.0.9", Trsvcid: "4420", NQN: other}); err != nil {
		t.Fatal(err)
	}
	before = len(r.k.Calls())
	if err := r.att.Undo(context.Background(), a, volume.CoTenants{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete nvme1"}, r.k.Calls()[before:]); diff != "" {
		t.Errorf("Undo (-want +got):\n%s", diff)
	}
}

// TestDetach_DeletesTheSubsystemsControllersOfUnknownAddress: pathmend
// restarted while one path of its last volume on a subsystem was
// reconnecting, so it never saw that controller live and does not know
// its address (it is not read while the controller is not live).
// Whichever endpoint it goes to, no staged volume uses the subsystem
// any more: NodeUnstage deletes it too, rather than leave a controller
// the kernel reconnects for ever.
func TestDetach_DeletesTheSubsystemsControllersOfUnknownAddress(t *testing.T) {
	r := newRig(t)
	if _, err := r.attach(t, "vol-1", 1); err != nil {
		t.Fatal(err)
	}
	r.k.SetUnreachable("127.0.0.2:4420", true)
	restarted := mustAttacher(t, r)
	v1 := volume.Record{VolumeID: "vol-1", Context: nvmeVolume(1)}
	before := len(r.k.Calls())
	if err := restarted.Detach(context.Background(), v1, volume.CoTenants{}); err != nil {
		t.Fatal(err)
	}
	got := r.k.Calls()[before:]
	slices.Sort(got)
	if diff := cmp.Diff([]string{"delete nvme0", "delete nvme1"}, got); diff != "" {
		t.Errorf("detach (-want +got):\n%s", diff)
	}
}

// mustAttacher is a new attacher on r's kernel: a restarted pathmend.
func mustAttacher(t *testing.T, r *rig) *attach.Attacher {
	t.Helper()
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: r.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := attach.NewAttacher(attach.AttacherConfig{
		SysFS: r.k.FS(), DevRoot: "/dev", Connector: r.k, Policy: policy,
		Host:       fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"},
		AttachWait: 300 * time.Millisecond, Poll: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
