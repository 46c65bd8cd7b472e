package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/exec"
	fakeexec "k8s.io/utils/exec/testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/scrub"
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
	var mu sync.Mutex
	var healthy error
	check := func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return healthy
	}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveListener(ctx, lis, m, CachedCheck(check, HealthTTL, clk)) }()
	base := "http://" + lis.Addr().String()

	body := get(t, base+"/metrics", http.StatusOK)
	for _, want := range []string{"pathmend_monitor_tick_duration_seconds_count 1", "pathmend_monitor_processes_started_total 0", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	get(t, base+"/healthz", http.StatusOK)
	mu.Lock()
	healthy = errors.New("last monitor tick 2m ago")
	mu.Unlock()
	// Within HealthTTL the last result stands; past it the check runs again.
	get(t, base+"/healthz", http.StatusOK)
	clk.SetTime(clk.Now().Add(HealthTTL))
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

// TestCachedCheck_RunsAtMostOncePerTTL: any number of calls within the TTL
// run the check once and share its result, error or not; the first call
// past the TTL runs it again.
func TestCachedCheck_RunsAtMostOncePerTTL(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	runs := 0
	result := errors.New("not ready")
	cached := CachedCheck(func(context.Context) error { runs++; return result }, time.Second, clk)
	ctx := context.Background()
	for range 10000 {
		if err := cached(ctx); err != result {
			t.Fatalf("cached = %v, want %v", err, result)
		}
	}
	if runs != 1 {
		t.Fatalf("10,000 calls within the TTL ran the check %d times, want 1", runs)
	}
	clk.SetTime(clk.Now().Add(999 * time.Millisecond))
	result = nil
	if err := cached(ctx); err == nil || runs != 1 {
		t.Errorf("just before the TTL: %v after %d runs, want the cached error after 1", err, runs)
	}
	clk.SetTime(clk.Now().Add(time.Millisecond))
	if err := cached(ctx); err != nil || runs != 2 {
		t.Errorf("at the TTL: %v after %d runs, want a fresh nil after 2", err, runs)
	}
}

// TestCachedCheck_OneRunInFlight: callers arriving while a run is in
// flight wait for it and share its result; a caller that gives up does not
// cancel the run for the others.
func TestCachedCheck_OneRunInFlight(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var mu sync.Mutex
	runs := 0
	started, release := make(chan struct{}), make(chan struct{})
	cached := CachedCheck(func(ctx context.Context) error {
		mu.Lock()
		runs++
		mu.Unlock()
		close(started)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, time.Second, clk)

	first, cancelFirst := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() { firstErr <- cached(first) }()
	<-started
	const waiters = 50
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- cached(context.Background()) }()
	}
	cancelFirst() // the caller that started the run hangs up
	if err := <-firstErr; err == nil {
		t.Error("the caller that hung up got a result")
	}
	close(release)
	for range waiters {
		if err := <-errs; err != nil {
			t.Errorf("waiter: %v, want the run's nil", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Errorf("%d runs, want 1", runs)
	}
}

// TestHandler_ScrubsLabelValues: a volume ID that holds a secret the
// process has seen is served with the secret replaced.
func TestHandler_ScrubsLabelValues(t *testing.T) {
	const secret = "metrics-test-pass-77x"
	scrub.Add(scrub.CHAPPassword, secret)
	m := New()
	m.SetVolumePaths("vol-"+secret, "iscsi", 2, 2, 2)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	if strings.Contains(body, secret) {
		t.Fatalf("the secret is served:\n%s", body)
	}
	if !strings.Contains(body, `volume_id="vol-***"`) {
		t.Errorf("no scrubbed series in:\n%s", body)
	}
}
