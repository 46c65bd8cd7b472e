package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/exec"
	fakeexec "k8s.io/utils/exec/testing"

	"github.com/pathmend/pathmend/pkg/heal"
)

func TestVolumeSeriesAreRemovedOnForget(t *testing.T) {
	m := New()
	m.SetVolumePaths("vol-a", "nvme-tcp", 3, 2, 1)
	m.SetVolumePaths("vol-b", "nvme-tcp", 2, 2, 1)
	if n := testutil.CollectAndCount(m.volumePaths); n != 6 {
		t.Fatalf("series = %d, want 6", n)
	}
	if v := testutil.ToFloat64(m.volumePaths.WithLabelValues("vol-a", "nvme-tcp", "live")); v != 2 {
		t.Errorf("live = %v", v)
	}
	m.ForgetVolume("vol-a")
	if n := testutil.CollectAndCount(m.volumePaths); n != 3 {
		t.Errorf("series after forget = %d, want 3", n)
	}
}

func TestDefectsAreReplacedPerTransport(t *testing.T) {
	m := New()
	m.SetDefects("nvme-tcp", map[heal.Kind]int{heal.NoNamespace: 1, heal.ControllerNotContributing: 2})
	m.SetDefects("iscsi", map[heal.Kind]int{"SessionStuck": 1})
	m.SetDefects("nvme-tcp", map[heal.Kind]int{heal.ControllerNotContributing: 1})
	want := `
# HELP pathmend_defects Defects found by the last diagnosis, by transport and kind.
# TYPE pathmend_defects gauge
pathmend_defects{kind="ControllerNotContributing",transport="nvme-tcp"} 1
pathmend_defects{kind="SessionStuck",transport="iscsi"} 1
`
	if err := testutil.CollectAndCompare(m.defects, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestOutcomesAreCountedWithBoundedReasons(t *testing.T) {
	m := New()
	d := heal.Defect{Kind: heal.ControllerNotContributing, Scope: heal.ScopeController}
	m.ObserveOutcomes("nvme-tcp", []heal.Outcome{
		{Defect: d, Verdict: heal.Deferred, Class: heal.ClassGrace, Reason: "grace: nvme4 is 97ms old, 4.9s left"},
		{Defect: d, Verdict: heal.Deferred, Class: heal.ClassGrace, Reason: "grace: nvme4 is 1.1s old, 3.9s left"},
		{Defect: d, Verdict: heal.Repaired, Class: heal.ClassTornDown, Reason: "tore down nvme4 (tcp 127.0.0.1:4421)"},
		{Defect: d, Verdict: heal.Refused, Class: heal.ClassCoTenants, Reason: "would leave co-tenants with no accessible path: nvme0n2 (/dev/nvme0n2)"},
	})
	// The label is the class, never the text: no truncation, no names.
	want := `
# HELP pathmend_repairs_total Heal verdicts by transport, defect kind, scope, verdict (repaired, observed, deferred, refused, failed) and reason class.
# TYPE pathmend_repairs_total counter
pathmend_repairs_total{kind="ControllerNotContributing",reason="co_tenants",scope="controller",transport="nvme-tcp",verdict="refused"} 1
pathmend_repairs_total{kind="ControllerNotContributing",reason="grace",scope="controller",transport="nvme-tcp",verdict="deferred"} 2
pathmend_repairs_total{kind="ControllerNotContributing",reason="torn_down",scope="controller",transport="nvme-tcp",verdict="repaired"} 1
`
	if err := testutil.CollectAndCompare(m.repairs, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestCountingExec(t *testing.T) {
	m := New()
	fe := &fakeexec.FakeExec{CommandScript: []fakeexec.FakeCommandAction{
		func(cmd string, args ...string) exec.Cmd { return &fakeexec.FakeCmd{} },
		func(cmd string, args ...string) exec.Cmd { return &fakeexec.FakeCmd{} },
	}}
	e := m.CountingExec(fe)
	e.Command("iscsiadm", "-m", "session")
	e.CommandContext(context.Background(), "systemctl", "restart", "iscsid")
	if v := testutil.ToFloat64(m.processes); v != 2 {
		t.Errorf("processes = %v, want 2", v)
	}
	var nilM *Metrics
	nilM.ProcessStarted() // a nil Metrics records nothing and does not panic
}

func TestServe_MetricsAndHealthz(t *testing.T) {
	m := New()
	m.ObserveTick(12*time.Millisecond, time.Now())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var healthy error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, lis, m, func(context.Context) error { return healthy }) }()
	base := "http://" + lis.Addr().String()

	body := get(t, base+"/metrics", http.StatusOK)
	for _, want := range []string{"pathmend_monitor_tick_duration_seconds_count 1", "pathmend_monitor_processes_started_total 0", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	get(t, base+"/healthz", http.StatusOK)
	healthy = errors.New("last monitor tick 2m ago")
	if body := get(t, base+"/healthz", http.StatusServiceUnavailable); !strings.Contains(body, "2m ago") {
		t.Errorf("healthz body = %q", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeListener: %v", err)
	}
}

func get(t *testing.T, url string, code int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != code {
		t.Fatalf("GET %s = %d, want %d: %s", url, resp.StatusCode, code, b)
	}
	return string(b)
}
