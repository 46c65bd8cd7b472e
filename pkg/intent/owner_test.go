package intent

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/volume"
)

var (
	nqnA = volume.Target{Transport: volume.TransportNVMeTCP, Name: "nqn.2014-08.io.pathmend.test:a"}
	nqnB = volume.Target{Transport: volume.TransportNVMeTCP, Name: "nqn.2014-08.io.pathmend.test:b"}
)

func newStore(t *testing.T) *volume.Store {
	t.Helper()
	s, err := volume.NewStore(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newOwner(t *testing.T, clk *clocktesting.FakeClock, run func(func())) (*Owner, *volume.Store) {
	t.Helper()
	s := newStore(t)
	o, err := New(Config{MaxJobs: 2}, Deps{Store: s, Clock: clk, Runner: run})
	if err != nil {
		t.Fatal(err)
	}
	return o, s
}

func fakeClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
}

// record is a normalized nvme-tcp record of target t in state st.
func record(t *testing.T, id string, tgt volume.Target, st volume.State) volume.Record {
	t.Helper()
	c, _, err := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": tgt.Name, "endpoints": "127.0.0.1:4420", "nsid": "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return volume.Record{VolumeID: id, State: st, Context: c, StagingPath: "/staging/" + id, AccessType: volume.AccessMount, FSType: "ext4"}
}

func TestBegin_OneOperationPerVolume(t *testing.T) {
	o, _ := newOwner(t, fakeClock(), nil)
	end, err := o.Begin("pv-1", "NodeStageVolume")
	if err != nil {
		t.Fatal(err)
	}
	_, err = o.Begin("pv-1", "NodeUnstageVolume")
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Holder != "NodeStageVolume" {
		t.Fatalf("second Begin: err = %v, want busy with NodeStageVolume", err)
	}
	if h, ok := o.InFlight("pv-1"); !ok || h != "NodeStageVolume" {
		t.Errorf("InFlight = %q, %v", h, ok)
	}
	if _, err := o.Begin("pv-2", "x"); err != nil {
		t.Errorf("another volume is not held: %v", err)
	}
	end()
	end() // a second end is harmless
	if _, ok := o.InFlight("pv-1"); ok {
		t.Error("volume still in flight after end")
	}
	if _, err := o.Begin("pv-1", "again"); err != nil {
		t.Errorf("Begin after end: %v", err)
	}
}

// TestLock_WaitersAreDurablyBlockedAndTargetsIndependent: a waiter on a
// held target blocks on a channel (synctest sees it durably blocked),
// another target is not delayed at all, a cancelled waiter gives up, and
// the map frees a target nobody uses.
func TestLock_WaitersAreDurablyBlockedAndTargetsIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o, err := New(Config{}, Deps{Store: newStore(t)})
		if err != nil {
			t.Fatal(err)
		}
		a, err := o.Lock(context.Background(), nqnA, "NodeStageVolume pv-1")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *Lease)
		go func() {
			l, err := o.Lock(context.Background(), nqnA, "monitor")
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		synctest.Wait() // the waiter is durably blocked
		select {
		case <-got:
			t.Fatal("second Lock of a held target returned")
		default:
		}
		if l, busy := o.TryLock(nqnA, "job"); l != nil || busy != "NodeStageVolume pv-1" {
			t.Errorf("TryLock of a held target = %v, %q", l, busy)
		}
		b, busy := o.TryLock(nqnB, "job")
		if b == nil {
			t.Fatalf("another target is busy: %q", busy)
		}
		b.Unlock()

		ctx, cancel := context.WithCancel(context.Background())
		cancelled := make(chan error)
		go func() {
			_, err := o.Lock(ctx, nqnA, "cancelled")
			cancelled <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: err = %v", err)
		}

		a.Unlock()
		a.Unlock() // harmless
		l := <-got
		if l == nil {
			t.Fatal("waiter did not get the lease")
		}
		l.Unlock()
		if n := o.targets.Len(); n != 0 {
			t.Errorf("%d targets still in the lock map, want 0", n)
		}
	})
}

func TestLease_WritesOnlyItsTarget(t *testing.T) {
	clk := fakeClock()
	o, s := newOwner(t, clk, nil)
	l, err := o.Lock(context.Background(), nqnA, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := l.Put(record(t, "pv-b", nqnB, volume.StateAttaching)); err == nil {
		t.Error("Put of another target's record succeeded")
	}
	r := record(t, "pv-1", nqnA, volume.StateAttaching)
	if err := l.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("pv-1")
	if err != nil || got.State != volume.StateAttaching || !got.StateSince.Equal(clk.Now()) {
		t.Fatalf("record = %+v, %v; want attaching since now", got, err)
	}
	// Publications and attaching → staged need no lease; a state change
	// to detaching does.
	clk.Step(time.Minute)
	r.State = volume.StateDetaching
	if err := o.Update(r); err == nil || !strings.Contains(err.Error(), "needs the lease") {
		t.Errorf("Update to detaching without the lease: %v", err)
	}
	r.State = volume.StateStaged
	if err := o.Update(r); err != nil {
		t.Fatal(err)
	}
	staged, _ := s.Get("pv-1")
	r.Publications = []volume.Publication{{TargetPath: "/t"}}
	clk.Step(time.Minute)
	if err := o.Update(r); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Get("pv-1")
	if !got.StateSince.Equal(staged.StateSince) || got.StateSince.Equal(clk.Now()) {
		t.Errorf("a publication change moved StateSince: %v, staged at %v", got.StateSince, staged.StateSince)
	}
	if err := l.Delete("pv-1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Delete("pv-1"); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	l.Unlock()
	if err := l.Put(r); err == nil {
		t.Error("Put through a released lease succeeded")
	}
}

// TestCoTenants_FailClosedOnRecordsThatMayBeTheTargets: every record of
// the target in every state is a co-tenant; an unreadable record blocks
// teardown of its own target, and one whose target is unknown blocks every
// target.
func TestCoTenants_FailClosedOnRecordsThatMayBeTheTargets(t *testing.T) {
	o, s := newOwner(t, fakeClock(), nil)
	for _, r := range []volume.Record{
		record(t, "pv-1", nqnA, volume.StateStaged),
		record(t, "pv-2", nqnA, volume.StateAttaching),
		record(t, "pv-3", nqnA, volume.StateDetaching),
		record(t, "pv-4", nqnB, volume.StateStaged),
	} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	l, _ := o.Lock(context.Background(), nqnA, "test")
	co, err := l.CoTenants("pv-1")
	l.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"pv-2", "pv-3"}, co.IDs()); diff != "" || co.Err() != nil {
		t.Errorf("co-tenants of pv-1 (-want +got):\n%s (err %v)", diff, co.Err())
	}

	// A record a newer pathmend wrote for nqnB blocks nqnB only.
	writeFuture(t, s, "pv-5", nqnB)
	for tgt, blocked := range map[volume.Target]bool{nqnA: false, nqnB: true} {
		l, _ := o.Lock(context.Background(), tgt, "test")
		co, _ := l.CoTenants("pv-x")
		l.Unlock()
		if (co.Err() != nil) != blocked {
			t.Errorf("%s: CoTenants.Err = %v, want blocked %v", tgt, co.Err(), blocked)
		}
	}
	// A file nobody can decode blocks every target.
	writeGarbage(t, s, "pv-6")
	l, _ = o.Lock(context.Background(), nqnA, "test")
	co, _ = l.CoTenants("pv-x")
	l.Unlock()
	if err := co.Err(); !errors.Is(err, volume.ErrTeardownBlocked) {
		t.Errorf("undecodable record: CoTenants.Err = %v, want blocked", err)
	}
}

// TestGo_OneJobPerTargetBounded: Go never waits; it refuses a target
// that is held and any job beyond MaxJobs, and releases the lease when
// the job returns.
func TestGo_OneJobPerTargetBounded(t *testing.T) {
	var mu sync.Mutex
	var queued []func()
	run := func(f func()) { mu.Lock(); queued = append(queued, f); mu.Unlock() }
	o, _ := newOwner(t, fakeClock(), run)
	ctx := context.Background()
	var ran []string
	job := func(name string) func(context.Context, *Lease) {
		return func(_ context.Context, l *Lease) { ran = append(ran, name+" "+l.Target().Name) }
	}
	if ok, busy := o.Go(ctx, nqnA, "monitor", job("1")); !ok {
		t.Fatalf("first job refused: %s", busy)
	}
	if ok, busy := o.Go(ctx, nqnA, "monitor", job("2")); ok || busy != "monitor" {
		t.Errorf("second job of one target: started %v, busy %q", ok, busy)
	}
	if ok, _ := o.Go(ctx, nqnB, "monitor", job("3")); !ok {
		t.Error("job of another target refused")
	}
	c := volume.Target{Transport: volume.TransportISCSI, Name: "iqn.2024-01.io.example:c"}
	if ok, busy := o.Go(ctx, c, "monitor", job("4")); ok || !strings.Contains(busy, "job limit") {
		t.Errorf("third job with MaxJobs 2: started %v, busy %q", ok, busy)
	}
	// Another holder's jobs have a budget of their own.
	if ok, busy := o.Go(ctx, c, "iSCSI session heal", job("5")); !ok {
		t.Errorf("another holder's job refused: %s", busy)
	}
	for _, f := range queued {
		f()
	}
	if o.Jobs() != 0 {
		t.Errorf("%d jobs still counted", o.Jobs())
	}
	if l, busy := o.TryLock(nqnA, "x"); l == nil {
		t.Errorf("lease not released after the job: %s", busy)
	} else {
		l.Unlock()
	}
	if diff := cmp.Diff([]string{"1 " + nqnA.Name, "3 " + nqnB.Name, "5 " + c.Name}, ran); diff != "" {
		t.Errorf("jobs run (-want +got):\n%s", diff)
	}
}
