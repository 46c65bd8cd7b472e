package iscsiheal_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// kicker records what the heal asked for.
type kicker struct {
	mu    sync.Mutex
	calls []string
}

func (k *kicker) record(s string) { k.mu.Lock(); k.calls = append(k.calls, s); k.mu.Unlock() }
func (k *kicker) Login(_ context.Context, n iscsi.Node) error {
	k.record("login " + n.Portal.String())
	return nil
}
func (k *kicker) Logout(_ context.Context, n iscsi.Node, sid iscsi.SessionID) error {
	k.record("logout " + sid.String())
	return nil
}
func (k *kicker) RestartDaemon(context.Context) error { k.record("restart"); return nil }
func (k *kicker) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

type reachable struct{}

func (reachable) Probe(context.Context, volume.Endpoint) iscsi.Reachability {
	return iscsi.Reachability{ICMP: iscsi.ICMPReply}
}

// mounted says every device is mounted: the session's LUN is in use.
type mounted struct{}

func (mounted) InUse(dev string) (bool, string) { return true, dev + " is mounted at /mnt" }

// The loop in the foreign scope alone (companion mode), in repair mode: a
// session another driver logged in is stuck out of LOGGED_IN with its
// portal reachable, the last path of a LUN in use. Past the threshold,
// the plan restarts iscsid (never a logout), once.
func TestTransport_ForeignScopeRestartsIscsidForAStuckLastPath(t *testing.T) {
	dir := t.TempDir()
	top := iscsitest.Topology{Sessions: []iscsitest.Session{{
		ID: 1, Host: 2, Target: "iqn.2024-01.io.example:other", Address: "192.0.2.3", State: "FREE", RecoveryTmo: 5,
		LUNs: []iscsitest.LUN{{LUN: 0, Disk: "sda", WWID: "naa.60014050000000000000000000000001"}},
	}}}
	if err := top.Write(dir); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	k := &kicker{}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Policy: policy, Scope: iscsi.HealForeign, Threshold: 10 * time.Second, Now: clk.Now,
		Kicker: k, Prober: reachable{}, Use: mounted{},
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sysfs.New(dir), Healer: healer, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	mdl := model.New()
	ctx := context.Background()
	for range 15 {
		r := model.Round{Foreign: true, Stamp: mdl.Stamp(clk.Now())}
		p := tr.Plan(ctx, r)
		if len(p.Work) != 0 {
			t.Fatalf("a job planned for a restart: %+v", p.Work)
		}
		tr.Finish(ctx, r, model.Jobs{})
		clk.Step(time.Second)
	}
	if got := k.Calls(); !slices.Equal(got, []string{"restart"}) {
		t.Errorf("kicks = %v, want one iscsid restart", got)
	}
}
