package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// reachable is a prober for which every portal answers TCP.
type reachable struct{}

func (reachable) Probe(context.Context, volume.Endpoint) iscsi.Reachability {
	return iscsi.Reachability{TCPTime: time.Millisecond, ICMP: iscsi.ICMPNotPermitted}
}

// noKicks fails on any kick: the heal under test is in observe mode.
type noKicks struct{ t *testing.T }

func (k noKicks) Login(context.Context, iscsi.Node) error { k.t.Error("login"); return nil }
func (k noKicks) Logout(context.Context, iscsi.Node, iscsi.SessionID) error {
	k.t.Error("logout")
	return nil
}
func (k noKicks) RestartDaemon(context.Context) error { k.t.Error("restart"); return nil }

// The session heal as the loop runs it, through the iSCSI transport, on the real FREE capture with
// the process's observe-mode policy: the down session is a SessionDown
// defect in pathmend_defects, and once past the threshold its observed
// verdict counts in pathmend_repairs_total like an NVMe heal verdict.
func TestSessionHeal_VerdictsCountLikeTheNVMeHeals(t *testing.T) {
	clk := clocktesting.NewFakeClock(diagnoseNow)
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeObserve, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Policy: policy, Threshold: 45 * time.Second, Kicker: noKicks{t}, Prober: reachable{}, Now: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	sys := sysfs.New(sysRoot(t, "iscsi-session-free"))
	tr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sys, Healer: healer, Metrics: m, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := volume.Parse(map[string]string{"transport": "iscsi", "iqn": "iqn.2024-01.io.pathmend.lab:lost", "portals": labPortals, "lun": "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := volume.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(volume.Record{VolumeID: "pv-lost", State: volume.StateStaged, Context: c, Device: "/dev/sda", StagingPath: "/staging/pv-lost", AccessType: volume.AccessBlock}); err != nil {
		t.Fatal(err)
	}
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: store, Clock: clk, Runner: func(f func()) { f() }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := monitor.New(monitor.Config{}, monitor.Deps{Intents: owner, Transports: []monitor.Transport{tr}, Model: model.New(),
		Policy: policy, Metrics: m, Clock: clk, SysFS: sys, PathExists: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	s.Tick(ctx)
	clk.Step(time.Second)
	s.Tick(ctx)
	const defects = `
# HELP pathmend_defects Defects found by the last diagnosis, by transport and kind.
# TYPE pathmend_defects gauge
pathmend_defects{kind="SessionDown",transport="iscsi"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(defects), "pathmend_defects"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "pathmend_repairs_total"); n != 0 {
		t.Errorf("%d repairs_total series before the threshold", n)
	}
	clk.Step(45 * time.Second)
	s.Tick(ctx)
	const repairs = `
# HELP pathmend_repairs_total Heal verdicts by transport, defect kind, scope, verdict (repaired, observed, deferred, refused, failed) and reason class.
# TYPE pathmend_repairs_total counter
pathmend_repairs_total{kind="SessionDown",reason="observe_mode",scope="controller",transport="iscsi",verdict="observed"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(repairs), "pathmend_repairs_total"); err != nil {
		t.Error(err)
	}
}
