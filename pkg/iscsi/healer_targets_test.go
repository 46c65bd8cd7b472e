package iscsi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// blockingKicker is a fakeKicker whose logins wait for release.
type blockingKicker struct {
	fakeKicker
	entered chan struct{}
	release chan struct{}
}

func (k *blockingKicker) Login(ctx context.Context, n Node) error {
	k.record("login " + n.Portal.String())
	k.entered <- struct{}{}
	<-k.release
	return k.loginErr
}

// targetRig is a healer whose kicks run as jobs of an intent owner over a
// record store; the records the owner holds are what a job re-reads
// under the target's lease.
type targetRig struct {
	*rig
	owner *intent.Owner
	store *volume.Store
}

func newTargetRig(t *testing.T, kicker Kicker, runner func(func())) *targetRig {
	t.Helper()
	store, err := volume.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &targetRig{store: store}
	r.rig = newRig(t, func(c *HealerConfig) {
		c.ReloginCooldown = time.Minute
		if kicker != nil {
			c.Kicker = kicker
		}
	})
	if r.owner, err = intent.New(intent.Config{}, intent.Deps{Store: store, Clock: r.clk, Runner: runner}); err != nil {
		t.Fatal(err)
	}
	r.jobs = r.owner
	return r
}

// put writes rec (normalized by Parse) in state st and returns it.
func (r *targetRig) put(t *testing.T, rec volume.Record, st volume.State) volume.Record {
	t.Helper()
	c, _, err := volume.Parse(rec.Context.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec.Context, rec.State = c, st
	if err := r.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

var targetT = volume.Target{Transport: volume.TransportISCSI, Name: iqnT}

// TestHeal_KickRunsOffTheTickWithTheTargetsLease: a login that hangs
// (iscsiadm waiting out a target that accepts TCP and rejects logins)
// runs as a job: the tick that starts it returns at once, the next one
// waits for it instead of kicking again, and the time to LOGGED_IN is
// measured from the kick's start.
func TestHeal_KickRunsOffTheTickWithTheTargetsLease(t *testing.T) {
	k := &blockingKicker{entered: make(chan struct{}), release: make(chan struct{})}
	r := newTargetRig(t, k, func(f func()) { go f() })
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	pv := r.put(t, rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2"), volume.StateStaged)
	r.tick(0, snap, pv)

	rp := report(t, r.tick(45*time.Second, snap, pv), 0)
	if rp.Verdict != heal.Kicked || rp.Kick != KickLogin {
		t.Fatalf("kick tick: %+v", rp)
	}
	<-k.entered // the login runs, the tick has returned
	if _, busy := r.owner.TryLock(targetT, "test"); busy != "iSCSI session heal" {
		t.Errorf("target held by %q during the login, want the heal", busy)
	}
	rp = report(t, r.tick(30*time.Second, snap, pv), 0)
	if rp.Verdict != "" || !strings.HasPrefix(rp.Reason, "awaiting LOGGED_IN after login 30s ago") {
		t.Fatalf("tick during the login: %+v", rp)
	}
	close(k.release)
	waitJobs(t, r.owner)
	up := &Snapshot{Sessions: append(snap.Sessions, sess(2, SessionLoggedIn, "127.0.0.2", disk(0, "sdb")))}
	rp = report(t, r.tick(time.Second, up, pv), 2)
	if rp.Verdict != heal.Repaired || rp.TimeToLoggedIn != 31*time.Second {
		t.Fatalf("after the login: %+v, want repaired 31s after the kick began", rp)
	}
	if diff := cmp.Diff([]string{"login 127.0.0.2:3260"}, k.Calls()); diff != "" {
		t.Errorf("kicks (-want +got):\n%s", diff)
	}
}

// TestHeal_BusyTargetDefersTheKick: while an RPC holds the target (an
// attach logging in, a detach logging out), the heal does not kick.
func TestHeal_BusyTargetDefersTheKick(t *testing.T) {
	r := newTargetRig(t, nil, func(f func()) { f() })
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	pv := r.put(t, rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2"), volume.StateStaged)
	lease, err := r.owner.Lock(context.Background(), targetT, "NodeUnstageVolume pv")
	if err != nil {
		t.Fatal(err)
	}
	r.tick(0, snap, pv)
	rp := report(t, r.tick(45*time.Second, snap, pv), 0)
	if rp.Verdict != heal.Deferred || rp.Reason != "target busy: NodeUnstageVolume pv" || len(r.kicker.Calls()) != 0 {
		t.Fatalf("busy target: %+v, kicks %v", rp, r.kicker.Calls())
	}
	lease.Unlock()
	rp = report(t, r.tick(time.Second, snap, pv), 0)
	if rp.Verdict != heal.Kicked {
		t.Fatalf("free target: %+v", rp)
	}
}

// TestHeal_NeverLogsInAVolumeBeingDetached: the tick saw the volume
// staged, but by the time its job holds the lease the record is
// detaching (NodeUnstage logged the portal out on purpose): the job
// re-reads the records and does not log it back in.
func TestHeal_NeverLogsInAVolumeBeingDetached(t *testing.T) {
	r := newTargetRig(t, nil, func(f func()) { f() })
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	pv := r.put(t, rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2"), volume.StateStaged)
	r.tick(0, snap, pv)
	r.put(t, pv, volume.StateDetaching) // the tick below plans from the stale list
	rp := report(t, r.tick(45*time.Second, snap, pv), 0)
	if rp.Verdict != heal.Refused || !strings.Contains(rp.Reason, "detaching or unstaged") {
		t.Fatalf("%+v", rp)
	}
	if c := r.kicker.Calls(); len(c) != 0 {
		t.Errorf("kicked a volume being detached: %v", c)
	}
}

// TestHeal_FailedJobKickIsSettledInTheSameTick with a synchronous runner,
// and a rejected login stops further kicks.
func TestHeal_FailedJobKickIsSettled(t *testing.T) {
	r := newTargetRig(t, nil, func(f func()) { f() })
	r.kicker.loginErr = &CommandError{Command: "iscsiadm --login", Code: ExitLoginAuthFailed, kind: ErrAuthFailed}
	snap := &Snapshot{Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda"))}}
	pv := r.put(t, rec("pv", iqnT, 0, "/dev/sda", "127.0.0.1", "127.0.0.2"), volume.StateStaged)
	r.tick(0, snap, pv)
	rp := report(t, r.tick(45*time.Second, snap, pv), 0)
	if rp.Verdict != heal.Failed || !errors.Is(rp.Err, ErrAuthFailed) {
		t.Fatalf("%+v", rp)
	}
	rp = report(t, r.tick(2*time.Minute, snap, pv), 0)
	if rp.Verdict != heal.Refused || !strings.HasPrefix(rp.Reason, "login rejected by the target:") {
		t.Fatalf("after the rejection: %+v", rp)
	}
}

// waitJobs waits (real time: the jobs run on goroutines) until no job runs.
func waitJobs(t *testing.T, o *intent.Owner) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for o.Jobs() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a job did not end")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHeal_AFailedJobReloginIsOwedAndLoggedInAgain: kicks run as target
// jobs (as in pathmend serve). In heal scope all, a session of a target
// pathmend never staged is logged out by a relogin whose login fails: the
// job's result owes the node record a login, and the owed login, run as a
// job again, is still wanted under the lease although the target has no
// record — until the session is back.
func TestHeal_AFailedJobReloginIsOwedAndLoggedInAgain(t *testing.T) {
	r := newTargetRig(t, nil, func(f func()) { f() })
	r.h.cfg.Scope = HealAll
	snap := &Snapshot{
		Sessions: []Session{sess(1, SessionLoggedIn, "127.0.0.1", disk(0, "sda")), sess(2, SessionFree, "127.0.0.2", disk(0, "sdb"))},
		Maps:     []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda", "sdb"}}},
	}
	gone := &Snapshot{Sessions: snap.Sessions[:1], Maps: []MultipathMap{{Device: "dm-0", Name: "mpatha", Slaves: []string{"sda"}}}}
	back := relogged(snap, 2, 9)
	r.kicker.setLoginErr(timeoutErr)
	r.tick(0, snap)
	rp := report(t, r.tick(45*time.Second, snap), 2)
	if rp.Verdict != heal.Failed || rp.Kick != KickRelogin || !strings.Contains(rp.Reason, "logs it in again after the cooldown") {
		t.Fatalf("relogin: %+v", rp)
	}
	if rp := report(t, r.tick(10*time.Second, gone), 0); !rp.Owed || !rp.InScope || rp.Verdict != heal.Deferred {
		t.Fatalf("after the failed relogin: %+v", rp)
	}
	r.kicker.setLoginErr(nil)
	kicked := false
	for range 6 {
		if rp := report(t, r.tick(10*time.Second, gone), 0); rp.Verdict == heal.Kicked {
			kicked = true
			break
		} else if rp.Verdict == heal.Refused {
			t.Fatalf("owed login refused under the lease: %+v", rp)
		}
	}
	if !kicked {
		t.Fatal("the owed login was not kicked within a cooldown")
	}
	if rp := report(t, r.tick(2*time.Second, back), 9); rp.Verdict != heal.Repaired || rp.Kick != KickLogin {
		t.Fatalf("back: %+v", rp)
	}
	want := []string{"logout session2 127.0.0.2:3260", "login 127.0.0.2:3260", "login 127.0.0.2:3260"}
	if diff := cmp.Diff(want, r.kicker.Calls()); diff != "" {
		t.Errorf("kicks (-want +got):\n%s", diff)
	}
}
