package nvme

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// instance returns s renumbered as subsystem instance n.
func instance(n int, s nvmetest.Subsystem) nvmetest.Subsystem {
	s.Instance = n
	return s
}

func TestInspect_AmbiguousHead(t *testing.T) {
	good := sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, legs(nopt, 1)))
	// An older instance answering the same NQN whose controller keeps
	// reconnecting to a path the target no longer serves.
	stale := instance(3, sub([]int{1}, ctrl(2, "connecting", legs("inaccessible", 1))))
	ambiguous := heal.Defect{
		Kind: heal.AmbiguousHead, Scope: heal.ScopeSubsystem,
		Subject: "nvme-subsys3 (" + nqnA + ")", Key: "nvme-subsys3",
		Teardown: []heal.Path{hp(2, "connecting", "inaccessible")},
		Volumes:  []string{"v1"},
		Detail:   nqnA + " is answered by nvme-subsys0 and nvme-subsys3; nvme-subsys3 has no usable path (block devices nvme3n1)",
	}
	for _, tc := range []struct {
		name string
		subs []nvmetest.Subsystem
		out  []heal.Defect
	}{
		{name: "the instance without a usable path is named", subs: []nvmetest.Subsystem{good, stale}, out: []heal.Defect{ambiguous}},
		{
			name: "each stale instance is its own defect, and the usable one is still diagnosed",
			subs: []nvmetest.Subsystem{
				sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, nil)),
				stale,
				instance(4, sub([]int{1})),
			},
			out: []heal.Defect{
				ambiguous,
				{
					Kind: heal.AmbiguousHead, Scope: heal.ScopeSubsystem,
					Subject: "nvme-subsys4 (" + nqnA + ")", Key: "nvme-subsys4",
					Teardown: []heal.Path{},
					Volumes:  []string{"v1"},
					Detail:   nqnA + " is answered by nvme-subsys0 and nvme-subsys4; nvme-subsys4 has no usable path (block devices nvme4n1) and no controller",
				},
				{
					Kind: heal.ControllerNotContributing, Scope: heal.ScopeController,
					Subject: "nvme1 (tcp 192.0.2.1:4421)", Key: ctrlKey(1),
					Teardown: []heal.Path{hp(1, live, "")},
					Volumes:  []string{"v1"},
					Detail:   "live controller nvme1 of nvme-subsys0 has no path to nvme0n1 (nsid 1)",
				},
			},
		},
		{
			name: "two instances with usable paths: no stale one to name",
			subs: []nvmetest.Subsystem{good, instance(3, sub([]int{1}, ctrl(2, live, legs(opt, 1))))},
		},
		{
			name: "no instance usable: nothing to tell them apart",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, "connecting", legs(opt, 1))), stale},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := readTopology(t, nvmetest.Topology{Subsystems: tc.subs})
			if d := cmp.Diff(tc.out, Inspect(h, []Expectation{vol("v1", 1, 0, 1, 2)})); d != "" {
				t.Errorf("Inspect (-want +got):\n%s", d)
			}
		})
	}
}

func TestInspect_TeardownOrderPutsOptimizedLast(t *testing.T) {
	s := sub([]int{1},
		ctrl(0, live, legs(opt, 1)),
		ctrl(1, live, legs(nopt, 1)),
		ctrl(2, live, legs("inaccessible", 1)),
		ctrl(3, "connecting", legs(opt, 1)),
		ctrl(4, live, legs(nvmetest.NoANA, 1)),
		ctrl(5, live, legs("change", 1)),
	)
	h := readTopology(t, nvmetest.Topology{Subsystems: []nvmetest.Subsystem{s}})
	got := Inspect(h, []Expectation{vol("v9", 9, 0, 1, 2, 3, 4, 5)})
	if len(got) != 1 || got[0].Kind != heal.NamespaceMissing {
		t.Fatalf("Inspect = %+v, want one NamespaceMissing", got)
	}
	want := []heal.Path{
		hp(3, "connecting", opt), hp(2, live, "inaccessible"), hp(5, live, "change"),
		hp(1, live, nopt), hp(0, live, opt), hp(4, live, ""),
	}
	if d := cmp.Diff(want, got[0].Teardown); d != "" {
		t.Errorf("teardown (-want +got):\n%s", d)
	}
}

func TestInspect_OrderIsByNQN(t *testing.T) {
	b := sub(nil, ctrl(0, live, nil))
	b.NQN = "nqn.2024-01.io.pathmend.test:b"
	a := instance(1, sub(nil, ctrl(1, live, nil)))
	h := readTopology(t, nvmetest.Topology{Subsystems: []nvmetest.Subsystem{b, a}})
	got := Inspect(h, nil)
	var keys []string
	for _, d := range got {
		keys = append(keys, d.Key)
	}
	if d := cmp.Diff([]string{nqnA, b.NQN}, keys); d != "" {
		t.Errorf("defect keys (-want +got):\n%s", d)
	}
	if d := cmp.Diff(got, Inspect(h, nil)); d != "" {
		t.Errorf("Inspect is not deterministic:\n%s", d)
	}
}

func TestInspect_UnknownStateIsNotJudged(t *testing.T) {
	s := sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, "unknown state", nil))
	h := readTopology(t, nvmetest.Topology{Subsystems: []nvmetest.Subsystem{s}})
	if got := Inspect(h, []Expectation{vol("v1", 1, 0)}); len(got) != 0 {
		t.Errorf("Inspect = %+v", got)
	}
}

func TestExpectation_MatchIdentity(t *testing.T) {
	ns := &Namespace{NSID: 2, NGUID: "0a0b0c0d-0000-0000-0000-0000000000ff", UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2"}
	for _, tc := range []struct {
		e    Expectation
		want idMatch
	}{
		{Expectation{NSID: 2}, idMatches},
		{Expectation{NSID: 3}, idDiffers},
		{Expectation{NGUID: "0A0B0C0D0000000000000000000000FF"}, idMatches},
		{Expectation{NSID: 2, NGUID: "0a0b0c0d0000000000000000000000fe"}, idDiffers},
		{Expectation{UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2"}, idMatches},
		{Expectation{NSID: 2, UUID: "00000000-c4c4-483b-8741-5e427c6750a2"}, idDiffers},
		{Expectation{}, idUnknown},
	} {
		if got := tc.e.matchIdentity(ns); got != tc.want {
			t.Errorf("%+v.matchIdentity = %d, want %d", tc.e, got, tc.want)
		}
	}
	if got := (&Expectation{NGUID: "0a0b"}).matchIdentity(&Namespace{NSID: 1}); got != idUnknown {
		t.Errorf("NGUID against a namespace without one = %d, want idUnknown", got)
	}
}

func TestExpectationFromRecord(t *testing.T) {
	eps := []volume.Endpoint{{Host: "10.0.0.2", Port: 4420}, {Host: "10.0.0.3", Port: 4420}}
	r := volume.Record{VolumeID: "pv-1", Context: volume.Context{
		Transport: volume.TransportNVMeTCP,
		NVMe:      &volume.NVMeTCP{NQN: nqnA, Endpoints: eps, OptimizedEndpoints: eps[:1], NSID: 7, UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2"},
	}}
	got, ok := ExpectationFromRecord(r)
	want := Expectation{VolumeID: "pv-1", NQN: nqnA, Endpoints: eps, OptimizedEndpoints: eps[:1], NSID: 7, UUID: "f68ad72e-c4c4-483b-8741-5e427c6750a2"}
	if d := cmp.Diff(want, got); d != "" || !ok {
		t.Errorf("ExpectationFromRecord (ok %t) (-want +got):\n%s", ok, d)
	}
	if _, ok := ExpectationFromRecord(volume.Record{Context: volume.Context{Transport: volume.TransportISCSI, ISCSI: &volume.ISCSI{}}}); ok {
		t.Error("an iSCSI record gave an expectation")
	}
}
