package iscsi

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// fakeKicker records what the heal asked for.
type fakeKicker struct {
	mu         sync.Mutex
	calls      []string
	loginErr   error
	logoutErr  error
	restartErr error
	// during runs inside each login, e.g. to step a fake clock by the
	// time a slow login takes.
	during func()
}

func (k *fakeKicker) record(s string) { k.mu.Lock(); k.calls = append(k.calls, s); k.mu.Unlock() }

func (k *fakeKicker) Login(_ context.Context, n Node) error {
	k.record("login " + n.Portal.String())
	if k.during != nil {
		k.during()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.loginErr
}

func (k *fakeKicker) setLoginErr(err error) { k.mu.Lock(); k.loginErr = err; k.mu.Unlock() }

func (k *fakeKicker) Logout(_ context.Context, n Node, sid SessionID) error {
	k.record("logout " + sid.String() + " " + n.Portal.String())
	return k.logoutErr
}

func (k *fakeKicker) RestartDaemon(context.Context) error {
	k.record("restart")
	return k.restartErr
}

func (k *fakeKicker) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

// fakeProber answers from a settable map; unknown portals are reachable.
type fakeProber struct {
	mu     sync.Mutex
	down   map[string]bool
	probes int
}

func (p *fakeProber) set(portal string, reachable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down == nil {
		p.down = map[string]bool{}
	}
	p.down[portal] = !reachable
}

func (p *fakeProber) Probe(_ context.Context, ep volume.Endpoint) Reachability {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes++
	if p.down[ep.String()] {
		return Reachability{TCP: errors.New("connect: connection timed out"), TCPTime: 2 * time.Second, ICMP: ICMPNoReply}
	}
	return Reachability{TCPTime: time.Millisecond, ICMP: ICMPNotPermitted}
}

// rig is a healer on a fake clock with fake mechanism and prober.
type rig struct {
	t      *testing.T
	h      *SessionHealer
	clk    *clocktesting.FakeClock
	kicker *fakeKicker
	prober *fakeProber
	// jobs, when set, runs each target's kicks as the loop does: as a job
	// with the target's lease, never waiting for a busy target. Without
	// it the kicks run inside the tick, with no lease.
	jobs targetJobs
}

// targetJobs is what the loop's ticks need of the intent owner
// (*intent.Owner).
type targetJobs interface {
	Go(ctx context.Context, t volume.Target, holder string, job func(context.Context, *intent.Lease)) (started bool, busy string)
}

// tickHealer is one tick of the loop over h: Plan, one job per target
// with planned kicks (through jobs, as the iSCSI transport's Job, or
// inside the tick without), Settle.
func tickHealer(ctx context.Context, h *SessionHealer, jobs targetJobs, snap *Snapshot, recs []volume.Record, recsErr error) []Report {
	busy := map[string]string{}
	for _, iqn := range h.Plan(ctx, snap, recs, recsErr) {
		if jobs == nil {
			h.Kick(ctx, iqn, nil)
			continue
		}
		t := volume.Target{Transport: volume.TransportISCSI, Name: iqn}
		if started, holder := jobs.Go(ctx, t, "iSCSI session heal", func(ctx context.Context, l *intent.Lease) { h.Kick(ctx, iqn, l) }); !started {
			busy[iqn] = holder
		}
	}
	return h.Settle(busy)
}

func newRig(t *testing.T, mod func(*HealerConfig)) *rig {
	t.Helper()
	r := &rig{t: t, clk: clocktesting.NewFakeClock(t0), kicker: &fakeKicker{}, prober: &fakeProber{}}
	cfg := HealerConfig{Mode: heal.ModeRepair, Kicker: r.kicker, Prober: r.prober, Now: r.clk.Now}
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewSessionHealer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	return r
}

// tick steps the clock by d, then ticks.
func (r *rig) tick(d time.Duration, snap *Snapshot, recs ...volume.Record) []Report {
	r.clk.Step(d)
	return checkClasses(r.t, tickHealer(context.Background(), r.h, r.jobs, snap, recs, nil))
}

// checkClasses fails the test for a decided verdict without a documented
// class (the metric's reason label), and returns rs.
func checkClasses(t *testing.T, rs []Report) []Report {
	t.Helper()
	for _, r := range rs {
		if r.Verdict != "" && r.Verdict != heal.Kicked && r.Class.Meaning() == "" {
			t.Errorf("session %v: verdict %s with class %q (reason %q)", r.Session, r.Verdict, r.Class, r.Reason)
		}
	}
	return rs
}

// report returns the report of session id (0: the first absent one).
func report(t *testing.T, rs []Report, id SessionID) Report {
	t.Helper()
	for _, r := range rs {
		if r.Session == id && (id != 0 || r.State == SessionAbsent) {
			return r
		}
	}
	t.Fatalf("no report for %v in %+v", id, rs)
	return Report{}
}

// rec is a staged iSCSI volume.
func rec(id, iqn string, lun int, device string, portals ...string) volume.Record {
	v := &volume.ISCSI{IQN: iqn, LUN: lun}
	for _, p := range portals {
		v.Portals = append(v.Portals, volume.Endpoint{Host: p, Port: 3260})
	}
	return volume.Record{VolumeID: id, State: volume.StateStaged, Context: volume.Context{Transport: volume.TransportISCSI, ISCSI: v}, Device: device, AccessType: volume.AccessMount}
}

const iqnT = "iqn.2024-01.io.example:t"

// sess is a session of target iqnT at addr with LUNs.
func sess(id int, state SessionState, addr string, luns ...LUN) Session {
	cs := ConnUp
	if !state.LoggedIn() {
		cs = ConnFailed
	}
	for i := range luns {
		luns[i].Address.Host = HostID(id)
		if !state.LoggedIn() && luns[i].State == DeviceRunning {
			luns[i].State = DeviceBlocked
		}
	}
	return Session{
		ID: SessionID(id), Host: HostID(id), State: state, TargetName: iqnT, TPGT: 1, TargetID: 0, IfaceName: "default",
		Connections: []Connection{{ID: ConnectionID{Session: SessionID(id)}, State: cs, PersistentAddress: addr, PersistentPort: 3260}},
		LUNs:        luns,
	}
}

func disk(lun int, name string) LUN {
	return LUN{Address: SCSIAddress{LUN: lun}, State: DeviceRunning, WWID: "naa.6001405" + name, Disk: name, SizeBytes: 1 << 26}
}

// withState returns a copy of snap with session id in state st (its
// connection and disks following).
func withState(snap *Snapshot, id SessionID, st SessionState) *Snapshot {
	c := *snap
	c.Sessions = slices.Clone(snap.Sessions)
	for i, s := range c.Sessions {
		if s.ID != id {
			continue
		}
		s.State = st
		s.Connections = slices.Clone(s.Connections)
		s.LUNs = slices.Clone(s.LUNs)
		for j := range s.LUNs {
			s.LUNs[j].State = map[bool]DeviceState{true: DeviceRunning, false: DeviceBlocked}[st.LoggedIn()]
		}
		for j := range s.Connections {
			s.Connections[j].State = map[bool]ConnState{true: ConnUp, false: ConnFailed}[st.LoggedIn()]
		}
		c.Sessions[i] = s
	}
	return &c
}

// relogged returns a copy of snap where session old was replaced by a
// LOGGED_IN session newID on the same portal (what a logout + login does).
func relogged(snap *Snapshot, old, newID SessionID) *Snapshot {
	c := withState(snap, old, SessionLoggedIn)
	for i := range c.Sessions {
		if c.Sessions[i].ID == old {
			c.Sessions[i].ID = newID
		}
	}
	return c
}
