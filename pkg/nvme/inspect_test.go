package nvme

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

const nqnA = "nqn.2024-01.io.pathmend.test:a"

// sub is subsystem instance 0 of nqnA exporting the given heads (nsid ==
// head) through ctrls.
func sub(heads []int, ctrls ...nvmetest.Controller) nvmetest.Subsystem {
	s := nvmetest.Subsystem{Instance: 0, NQN: nqnA, Controllers: ctrls}
	for _, h := range heads {
		s.Namespaces = append(s.Namespaces, nvmetest.Namespace{Head: h, NSID: uint32(h)})
	}
	return s
}

// ctrl is controller n on port 4420+n, created an hour before testNow.
func ctrl(n int, state string, l map[int]string) nvmetest.Controller {
	return nvmetest.Controller{Instance: n, State: state, Trsvcid: itoa(4420 + n), Age: time.Hour, Legs: l}
}

// hp is the teardown entry Inspect gives for ctrl(n, state, …) read
// afresh: the address of a controller that is not live is not read.
func hp(n int, state, access string) heal.Path {
	ep := "tcp 192.0.2.1:" + itoa(4420+n)
	if state != live {
		ep = "tcp, " + AddressNotKnown
	}
	return heal.Path{
		Name:      "nvme" + itoa(n),
		Endpoint:  ep,
		State:     state,
		Access:    access,
		CreatedAt: testNow.Add(-time.Hour),
	}
}

// vol expects nsid on nqnA through the ports of the given controllers.
func vol(id string, nsid uint32, ctrls ...int) Expectation {
	e := Expectation{VolumeID: id, NQN: nqnA, NSID: nsid}
	for _, c := range ctrls {
		e.Endpoints = append(e.Endpoints, volume.Endpoint{Host: "192.0.2.1", Port: uint16(4420 + c)})
	}
	return e
}

func ctrlKey(n int) string { return nqnA + " tcp 192.0.2.1:" + itoa(4420+n) }

const (
	live = "live"
	opt  = "optimized"
	nopt = "non-optimized"
)

func TestInspect(t *testing.T) {
	healthy := sub([]int{1, 2}, ctrl(0, live, legs(opt, 1, 2)), ctrl(1, live, legs(nopt, 1, 2)))
	for _, tc := range []struct {
		name string
		subs []nvmetest.Subsystem
		want []Expectation
		out  []heal.Defect
	}{
		{name: "healthy, bare node", subs: []nvmetest.Subsystem{healthy}},
		{name: "healthy, with its volumes", subs: []nvmetest.Subsystem{healthy}, want: []Expectation{vol("v1", 1, 0, 1), vol("v2", 2, 0, 1)}},
		{
			name: "NoNamespace: a live controller and no namespace",
			subs: []nvmetest.Subsystem{sub(nil, ctrl(0, live, nil), ctrl(1, "connecting", nil))},
			want: []Expectation{vol("v1", 1, 0, 1)},
			out: []heal.Defect{{
				Kind: heal.NoNamespace, Scope: heal.ScopeSubsystem,
				Subject: "nvme-subsys0 (" + nqnA + ")", Key: nqnA,
				Teardown: []heal.Path{hp(1, "connecting", ""), hp(0, live, "")},
				Volumes:  []string{"v1"},
				Detail:   "nvme-subsys0 has 2 controllers, 1 live, and exports no namespace",
			}},
		},
		{name: "no namespace while every controller reconnects", subs: []nvmetest.Subsystem{sub(nil, ctrl(0, "connecting", nil), ctrl(1, "resetting", nil))}},
		{
			name: "a discovery subsystem exports no namespace by design",
			subs: []nvmetest.Subsystem{{Instance: 0, NQN: DiscoveryNQN, Type: "discovery", Controllers: []nvmetest.Controller{ctrl(0, live, nil)}}},
		},
		{
			name: "other transports are not diagnosed",
			subs: []nvmetest.Subsystem{{Instance: 0, NQN: nqnA, Controllers: []nvmetest.Controller{{Instance: 0, Transport: "rdma"}}}},
		},
		{
			name: "NamespaceMissing: the volume's nsid is gone, its co-tenants stay",
			subs: []nvmetest.Subsystem{sub([]int{1, 3}, ctrl(0, live, legs(opt, 1, 3)), ctrl(1, live, legs(nopt, 1, 3)))},
			want: []Expectation{vol("v1", 1, 0, 1), vol("v2", 2, 0, 1), vol("v3", 3, 0, 1)},
			out: []heal.Defect{{
				Kind: heal.NamespaceMissing, Scope: heal.ScopeSubsystem,
				Subject: nqnA + " nsid 2", Key: nqnA,
				Teardown: []heal.Path{hp(1, live, nopt), hp(0, live, opt)},
				CoTenants: []heal.CoTenant{
					{Namespace: "nvme-subsys0 nsid 1", Device: "nvme0n1"},
					{Namespace: "nvme-subsys0 nsid 3", Device: "nvme0n3"},
				},
				Volumes: []string{"v2"},
				Detail:  "volume v2 needs nsid 2; nvme-subsys0 exports nsid 1, 3",
			}},
		},
		{
			name: "NamespaceMissing: two volumes, one defect per subsystem",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)))},
			want: []Expectation{vol("v4", 4, 0), vol("v2", 2, 0)},
			out: []heal.Defect{{
				Kind: heal.NamespaceMissing, Scope: heal.ScopeSubsystem,
				Subject: nqnA + ": 2 namespaces", Key: nqnA,
				Teardown:  []heal.Path{hp(0, live, opt)},
				CoTenants: []heal.CoTenant{{Namespace: "nvme-subsys0 nsid 1", Device: "nvme0n1"}},
				Volumes:   []string{"v2", "v4"},
				Detail:    "volume v4 needs nsid 4; volume v2 needs nsid 2; nvme-subsys0 exports nsid 1",
			}},
		},
		{
			name: "an identity the namespaces do not publish is not a missing namespace",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)))},
			want: []Expectation{{VolumeID: "v", NQN: nqnA, NGUID: "00000000000000000000000000000009", Endpoints: vol("", 0, 0).Endpoints}},
		},
		{
			name: "ControllerNotContributing: a live controller without a leg",
			subs: []nvmetest.Subsystem{sub([]int{1, 2}, ctrl(0, live, legs(opt, 1, 2)), ctrl(1, live, legs(nopt, 1)))},
			out: []heal.Defect{{
				Kind: heal.ControllerNotContributing, Scope: heal.ScopeController,
				Subject: "nvme1 (tcp 192.0.2.1:4421)", Key: ctrlKey(1),
				Teardown: []heal.Path{hp(1, live, "")},
				Detail:   "live controller nvme1 of nvme-subsys0 has no path to nvme0n2 (nsid 2)",
			}},
		},
		{
			// The kernel removes a namespace's legs before its head: for a
			// moment the head has no leg at all, and no controller is to
			// blame (seen in the lab: both live controllers were torn
			// down). Namespace 1 keeps its legs through both.
			name: "a head without any leg makes no controller NotContributing",
			subs: []nvmetest.Subsystem{sub([]int{1, 2}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, legs(nopt, 1)))},
			want: []Expectation{vol("v1", 1, 0, 1)},
		},
		{
			name: "ControllerNotContributing whose teardown strands a co-tenant",
			subs: []nvmetest.Subsystem{sub([]int{1, 2}, ctrl(0, "connecting", legs(opt, 1, 2)), ctrl(1, live, legs(nopt, 1)))},
			want: []Expectation{vol("v1", 1, 0, 1)},
			out: []heal.Defect{{
				Kind: heal.ControllerNotContributing, Scope: heal.ScopeController,
				Subject: "nvme1 (tcp 192.0.2.1:4421)", Key: ctrlKey(1),
				Teardown:  []heal.Path{hp(1, live, "")},
				CoTenants: []heal.CoTenant{{Namespace: "nvme-subsys0 nsid 1", Device: "nvme0n1"}},
				Volumes:   []string{"v1"},
				Detail:    "live controller nvme1 of nvme-subsys0 has no path to nvme0n2 (nsid 2)",
			}},
		},
		{
			name: "controllers reconnecting or being created are not ControllerNotContributing",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, "connecting", nil), ctrl(2, "resetting", nil), ctrl(3, "new", nil))},
			want: []Expectation{vol("v1", 1, 0, 1, 2, 3)},
		},
		{
			name: "StaleEndpoint: the kernel gave up on a controller",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, "dead", legs(nopt, 1)))},
			out: []heal.Defect{{
				Kind: heal.StaleEndpoint, Scope: heal.ScopeController,
				Subject: "nvme1 (tcp, " + AddressNotKnown + ")", Key: nqnA + " nvme1",
				Teardown: []heal.Path{hp(1, "dead", nopt)},
				Detail:   "nvme1 of nvme-subsys0 is dead: the kernel gave up on it",
			}},
		},
		{
			name: "StaleEndpoint: no volume lists the endpoint; it carries the last usable path",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, "connecting", legs(opt, 1)), ctrl(1, live, legs(nopt, 1)))},
			want: []Expectation{vol("v1", 1, 0)},
			out: []heal.Defect{{
				Kind: heal.StaleEndpoint, Scope: heal.ScopeController,
				Subject: "nvme1 (tcp 192.0.2.1:4421)", Key: ctrlKey(1),
				Teardown:  []heal.Path{hp(1, live, nopt)},
				CoTenants: []heal.CoTenant{{Namespace: "nvme-subsys0 nsid 1", Device: "nvme0n1"}},
				Volumes:   []string{"v1"},
				Detail:    "nvme1 of nvme-subsys0 (live) goes to 192.0.2.1:4421, which no staged volume of " + nqnA + " lists",
			}},
		},
		{
			name: "an unlisted endpoint is StaleEndpoint, not also ControllerNotContributing",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, nil))},
			want: []Expectation{vol("v1", 1, 0)},
			out: []heal.Defect{{
				Kind: heal.StaleEndpoint, Scope: heal.ScopeController,
				Subject: "nvme1 (tcp 192.0.2.1:4421)", Key: ctrlKey(1),
				Teardown: []heal.Path{hp(1, live, "")},
				Volumes:  []string{"v1"},
				Detail:   "nvme1 of nvme-subsys0 (live) goes to 192.0.2.1:4421, which no staged volume of " + nqnA + " lists",
			}},
		},
		{
			name: "an endpoint named by host name cannot be compared: no StaleEndpoint",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, legs(nopt, 1)))},
			want: []Expectation{vol("v1", 1, 0), {VolumeID: "v2", NQN: nqnA, NSID: 1, Endpoints: []volume.Endpoint{{Host: "array.example", Port: 4421}}}},
		},
		{
			name: "endpoints of a subsystem no volume uses are not judged",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, live, legs(nopt, 1)))},
			want: []Expectation{{VolumeID: "other", NQN: "nqn.2024-01.io.pathmend.test:other", NSID: 1}},
		},
		{
			name: "a controller being deleted is left to the kernel",
			subs: []nvmetest.Subsystem{sub([]int{1}, ctrl(0, live, legs(opt, 1)), ctrl(1, "deleting", nil), ctrl(2, "deleting (no IO)", nil))},
			want: []Expectation{vol("v1", 1, 0)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := readTopology(t, nvmetest.Topology{Subsystems: tc.subs})
			if d := cmp.Diff(tc.out, Inspect(h, tc.want)); d != "" {
				t.Errorf("Inspect (-want +got):\n%s", d)
			}
		})
	}
}
