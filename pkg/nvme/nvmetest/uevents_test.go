package nvmetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// summary is an event without the names the two kernels number apart.
func summary(e uevent.Event) string {
	s := string(e.Action) + " " + e.Subsystem + " " + string(uevent.Objects(e)[0].Kind)
	if v := e.Get("NVME_EVENT"); v != "" {
		s += " NVME_EVENT=" + v
	}
	return s
}

// TestKernel_AnnouncesWhatTheLabsKernelAnnounces drives the fake kernel
// through the NVMe faults of the lab's catalogue and compares what it
// announces with what the 6.1 kernel announced (testdata/uevents): the
// relevant events, in order, names aside.
func TestKernel_AnnouncesWhatTheLabsKernelAnnounces(t *testing.T) {
	recs, err := ueventtest.LoadAll("../../../" + ueventtest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string][]string{}
	for _, r := range recs {
		evs, err := r.ParsedEvents()
		if err != nil {
			t.Fatal(err)
		}
		recorded[r.Fault] = []string{}
		for _, e := range evs {
			if uevent.Relevant(e) {
				recorded[r.Fault] = append(recorded[r.Fault], summary(e))
			}
		}
	}
	const nqn = "nqn.2024-01.io.pathmend.lab:uevents"
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	k := nvmetest.NewKernel(t.TempDir(), clk)
	tgt := nvmetest.Target{NQN: nqn, Namespaces: []nvmetest.Namespace{{Head: 1, NSID: 1, UUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427"}},
		Ports: map[string]string{"127.0.0.1:4420": "optimized", "127.0.0.1:4421": "non-optimized"}}
	k.AddTarget(tgt)
	k.Announce()
	connect := func(port string) {
		if _, err := k.Connect(context.Background(), fabrics.Options{Transport: "tcp", Traddr: "127.0.0.1", Trsvcid: port, NQN: nqn}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		fault string
		do    func()
	}{
		{"nvme-connect", func() { connect("4420") }},
		{"nvme-connect-second", func() { connect("4421") }},
		{"nvme-controller-delete", func() { k.Disconnect("nvme1") }},
		{"nvme-reconnect", func() { k.Reuse(1); connect("4421") }},
		{"nvme-port-unlink", func() { k.SetUnreachable("127.0.0.1:4421", true) }},
		{"nvme-port-relink", func() { k.SetUnreachable("127.0.0.1:4421", false) }},
		{"nvme-namespace-disable", func() { k.SetNamespaceEnabled(nqn, 1, false) }},
		{"nvme-namespace-enable", func() { k.SetNamespaceEnabled(nqn, 1, true) }},
		{"nvme-namespace-add", func() {
			tgt.Namespaces = append(tgt.Namespaces, nvmetest.Namespace{Head: 2, NSID: 2, UUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca428"})
			k.AddTarget(tgt)
		}},
		{"nvme-port-drop", func() { k.SetUnreachable("127.0.0.1:4421", true) }},
		{"nvme-port-restore", func() { k.SetUnreachable("127.0.0.1:4421", false) }},
		{"nvme-ctrl-loss", func() { k.SetUnreachable("127.0.0.1:4421", true); k.GiveUp("127.0.0.1:4421") }},
		{"nvme-disconnect-last", func() { k.Disconnect("nvme0") }},
	} {
		step.do()
		k.Refresh()
		got := []string{}
		for _, e := range k.TakeUevents() {
			if !uevent.Relevant(e) {
				t.Errorf("%s: announced %v, which is not relevant", step.fault, e)
			}
			got = append(got, summary(e))
		}
		if diff := cmp.Diff(recorded[step.fault], got); diff != "" {
			t.Errorf("%s: announced (-lab's kernel +fake):\n%s", step.fault, diff)
		}
	}
}
