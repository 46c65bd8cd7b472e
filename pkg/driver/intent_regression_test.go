package driver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The five interleavings of issue 13, each with the real driver, store,
// attachers (and monitor) over the fake NVMe kernel and the fake iSCSI
// host. Each failed before the intent owner: the comments say how.

// TestIntent_CrashBetweenAttachAndRecord: NodeStage attached (NVMe:
// controllers connected; iSCSI: both sessions logged in, node records with
// CHAP created) and the process died during mkfs. After a restart,
// NodeUnstage finds the attaching record and takes everything down.
// (Before: no record was written yet; NodeUnstage answered OK with
// "nothing to detach" and the sessions, node records and controllers
// stayed, owned by nobody.)
func TestIntent_CrashBetweenAttachAndRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		vc   map[string]string
		left func(n *node) string
	}{
		{"iscsi", iscsiVolumeContext(0), func(n *node) string {
			if s, r := n.host.SessionKeys(), n.host.RecordKeys(); len(s)+len(r) > 0 {
				return fmt.Sprintf("sessions %v, node records %v", s, r)
			}
			return ""
		}},
		{"nvme", nvmeVolumeContext(1), func(n *node) string {
			if live := n.livePaths(1); live > 0 {
				return fmt.Sprintf("%d live paths, calls %v", live, n.kernel.Calls())
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			inMount, never := make(chan struct{}), make(chan struct{})
			n.mnt.set(func(string, string) error {
				close(inMount)
				<-never // the process dies here, in mkfs/mount
				return errors.New("killed")
			})
			req := n.stageRequest("pv-1", tc.vc, false)
			req.Secrets = map[string]string{"chapUsername": "u", "chapPassword": "chap-secret-1"}
			if tc.name == "nvme" {
				req.Secrets = nil
			}
			dead := n.drv
			gone := make(chan struct{})
			go func() { _, _ = dead.NodeStageVolume(context.Background(), req); close(gone) }()
			// The dead process's goroutine is let go only after the test,
			// and waited for before its trees are removed.
			t.Cleanup(func() { close(never); <-gone })
			<-inMount
			if tc.left(n) == "" {
				t.Fatal("the stage had attached nothing before the crash")
			}

			n.restart()
			n.mnt.set(nil)
			if err := n.unstage("pv-1"); err != nil {
				t.Fatalf("NodeUnstage after the restart: %v", err)
			}
			if left := tc.left(n); left != "" {
				t.Errorf("left after NodeUnstage: %s", left)
			}
			if _, err := n.store.Get("pv-1"); !errors.Is(err, volume.ErrNotFound) {
				t.Errorf("record after NodeUnstage: %v", err)
			}
		})
	}
}

// TestIntent_CrashBetweenAttachAndRecordResumes: after the same crash,
// the CO's retry of NodeStage resumes the attaching volume and stages it.
func TestIntent_CrashBetweenAttachAndRecordResumes(t *testing.T) {
	n := newNode(t)
	inMount, never := make(chan struct{}), make(chan struct{})
	n.mnt.set(func(string, string) error { close(inMount); <-never; return errors.New("killed") })
	dead := n.drv
	req := n.stageRequest("pv-1", nvmeVolumeContext(1), false)
	gone := make(chan struct{})
	go func() { _, _ = dead.NodeStageVolume(context.Background(), req); close(gone) }()
	t.Cleanup(func() { close(never); <-gone })
	<-inMount
	n.restart()
	n.mnt.set(nil)
	if err := n.stage("pv-1", nvmeVolumeContext(1), false); err != nil {
		t.Fatalf("NodeStage retry: %v", err)
	}
	rec, err := n.store.Get("pv-1")
	if err != nil || rec.State != volume.StateStaged || rec.Device != "/dev/nvme0n1" {
		t.Fatalf("record after the retry: %+v, %v", rec, err)
	}
	if live := n.livePaths(1); live != 2 {
		t.Errorf("%d live paths, want 2", live)
	}
}

// TestIntent_UnreadableCoTenantRecordFailsClosed: pv-1 and pv-2 are
// namespaces 1 and 2 of one subsystem; pv-2's record was written by a
// newer pathmend (a rollback). NodeUnstage(pv-1) tears nothing down and
// fails naming pv-2's record; pv-2 keeps both paths. (Before: the NVMe
// co-tenant lookup ignored unreadable records when some were readable,
// deleted both controllers, and pv-2 was left with 0 of 2 paths.)
func TestIntent_UnreadableCoTenantRecordFailsClosed(t *testing.T) {
	n := newNode(t)
	for _, id := range []string{"pv-1", "pv-2"} {
		nsid := uint32(1)
		if id == "pv-2" {
			nsid = 2
		}
		if err := n.stage(id, nvmeVolumeContext(nsid), true); err != nil {
			t.Fatal(err)
		}
	}
	file := n.store.RecordPath("pv-2")
	newer := fmt.Sprintf(`{"version": %d, "volumeID": "pv-2", "context": {"transport": "nvme-tcp", "nvme": {"nqn": %q}}, "state": "staged"}`, volume.RecordVersion+1, sharedNQN)
	if err := os.WriteFile(file, []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}

	err := n.unstage("pv-1")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "written by a newer pathmend") {
		t.Fatalf("NodeUnstage(pv-1) = %v, want FailedPrecondition naming %s", err, file)
	}
	if d := n.deletes(); len(d) > 0 {
		t.Errorf("tore down %v with an unreadable co-tenant record", d)
	}
	if live := n.livePaths(2); live != 2 {
		t.Errorf("pv-2 has %d of 2 paths", live)
	}
	// Once the record is readable again, the unstage goes through and
	// still spares pv-2.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := n.stage("pv-2", nvmeVolumeContext(2), true); err != nil {
		t.Fatal(err)
	}
	if err := n.unstage("pv-1"); err != nil {
		t.Fatal(err)
	}
	if d, live := n.deletes(), n.livePaths(2); len(d) > 0 || live != 2 {
		t.Errorf("after the retry: deletes %v, pv-2 %d of 2 paths", d, live)
	}
}

// TestIntent_UnstageDuringACoTenantsStage: NodeStage(pv-2) has attached
// namespace 2 and is formatting it when NodeUnstage(pv-1), namespace 1 of
// the same subsystem, runs. pv-2's attaching record makes it a co-tenant:
// the controllers stay and pv-2 ends staged with 2 of 2 paths. (Before:
// pv-2 had no record until its stage finished; the unstage deleted both
// controllers and pv-2 was staged on 0 of 2 paths.)
func TestIntent_UnstageDuringACoTenantsStage(t *testing.T) {
	n := newNode(t)
	if err := n.stage("pv-1", nvmeVolumeContext(1), true); err != nil {
		t.Fatal(err)
	}
	inMount, release := make(chan struct{}), make(chan struct{})
	n.mnt.set(func(string, string) error { close(inMount); <-release; return nil })
	staged := make(chan error, 1)
	go func() { staged <- n.stage("pv-2", nvmeVolumeContext(2), false) }()
	<-inMount
	if err := n.unstage("pv-1"); err != nil {
		t.Fatalf("NodeUnstage(pv-1): %v", err)
	}
	close(release)
	if err := <-staged; err != nil {
		t.Fatalf("NodeStage(pv-2): %v", err)
	}
	if d := n.deletes(); len(d) > 0 {
		t.Errorf("the unstage tore down %v under a co-tenant's stage", d)
	}
	if live := n.livePaths(2); live != 2 {
		t.Errorf("pv-2 staged with %d of 2 paths", live)
	}
}

// racingIntents lists the records, then lets an RPC run before the
// monitor sees the listing: the tick plans from records older than the
// kernel it reads next.
type racingIntents struct {
	*intent.Owner
	once sync.Once
	rpc  func()
}

func (r *racingIntents) Scan() (volume.Listing, error) {
	l, err := r.Owner.Scan()
	r.once.Do(r.rpc)
	return l, err
}

// TestIntent_TickRacingAnUnstage: the monitor lists pv-1 staged, then
// NodeUnstage(pv-1) disconnects both paths and removes the record, then
// the monitor reads sysfs and sees both paths missing. Under the target's
// lease its job re-reads the records, finds pv-1 gone and reconnects
// nothing, in this tick and the next three. (Before: the tick reconnected
// both endpoints of the unstaged volume and the controllers stayed,
// owned by nobody.)
func TestIntent_TickRacingAnUnstage(t *testing.T) {
	n := newNode(t)
	if err := n.stage("pv-1", nvmeVolumeContext(1), true); err != nil {
		t.Fatal(err)
	}
	racing := &racingIntents{Owner: n.owner, rpc: func() {
		if err := n.unstage("pv-1"); err != nil {
			t.Errorf("NodeUnstage(pv-1): %v", err)
		}
	}}
	tr, err := nvmeheal.New(nvmeheal.Config{Owned: true}, nvmeheal.Deps{
		SysFS: n.kernel.FS(), Policy: n.policy, Connector: n.kernel, Host: testHost, Prober: reachableProber{}, Clock: n.clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	mon, err := monitor.New(monitor.Config{}, monitor.Deps{
		SysFS: n.kernel.FS(), Intents: racing, Policy: n.policy, Transports: []monitor.Transport{tr}, Model: model.New(),
		Clock: n.clk, PathExists: func(string) bool { return true },
	})
	if err != nil {
		t.Fatal(err)
	}
	before := len(n.kernel.Calls())
	for range 4 {
		mon.Tick(context.Background())
		n.clk.Step(time.Minute)
		n.kernel.Refresh()
	}
	var connects []string
	for _, c := range n.kernel.Calls()[before:] {
		if strings.HasPrefix(c, "connect") {
			connects = append(connects, c)
		}
	}
	if len(connects) > 0 {
		t.Errorf("the monitor reconnected an unstaged volume: %v", connects)
	}
	if live := n.livePaths(1); live != 0 {
		t.Errorf("%d paths of the unstaged volume, owned by nobody", live)
	}
}

type reachableProber struct{}

func (reachableProber) Reachable(context.Context, string) error { return nil }

// TestIntent_RollbackTakesOnlyWhatItMade: the node already has sessions
// to both portals of the target (and their node records), carrying LUN 1
// for someone else. NodeStage of LUN 0 fails to mount; its rollback
// removes what it created — nothing — and leaves the sessions and node
// records as they were. (Before: the rollback called Detach, which logged
// out both sessions and deleted their node records.)
func TestIntent_RollbackTakesOnlyWhatItMade(t *testing.T) {
	n := newNode(t)
	for _, portal := range []string{"127.0.0.1:3260", "127.0.0.2:3260"} {
		for _, argv := range [][]string{
			{"iscsiadm", "-m", "node", "-T", testIQN, "-p", portal, "-I", "default", "-o", "new"},
			{"iscsiadm", "-m", "node", "-T", testIQN, "-p", portal, "-I", "default", "--login"},
		} {
			if _, err := n.host.Exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v", argv, err)
			}
		}
	}
	sessions, records := n.host.SessionKeys(), n.host.RecordKeys()
	start := len(n.host.Exec.Lines())

	n.mnt.set(func(string, string) error { return errors.New("mount: wrong fs type") })
	if err := n.stage("pv-0", iscsiVolumeContext(0), false); err == nil {
		t.Fatal("stage with a failing mount succeeded")
	}
	if diff := cmp.Diff(sessions, n.host.SessionKeys()); diff != "" {
		t.Errorf("sessions after the rollback (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(records, n.host.RecordKeys()); diff != "" {
		t.Errorf("node records after the rollback (-before +after):\n%s", diff)
	}
	for _, l := range n.host.Exec.Lines()[start:] {
		if strings.Contains(l, " -u") || strings.Contains(l, "-o delete") {
			t.Errorf("the rollback ran %q", l)
		}
	}
	if _, err := n.store.Get("pv-0"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("record after the rolled back stage: %v", err)
	}
}
