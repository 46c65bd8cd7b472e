package monitor

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/metrics"
)

// TestTick_MetricsAfterAScriptedRepair scrapes /metrics after the monitor
// repaired a controller that contributed no path, then after the volume
// was unstaged.
func TestTick_MetricsAfterAScriptedRepair(t *testing.T) {
	r := newRig(t, heal.ModeRepair, nil)
	m := metrics.New()
	r.m.deps.Metrics = m
	r.set(t, rec("vol-a", nqnA, "127.0.0.1", "127.0.0.2"))
	r.connectAged(t, nqnA, "127.0.0.1", "127.0.0.2")
	r.k.DropLegs(1)
	r.m.Tick(context.Background())

	body := scrape(t, m)
	for _, want := range []string{
		`pathmend_defects{kind="ControllerNotContributing",transport="nvme-tcp"} 1`,
		`pathmend_repairs_total{kind="ControllerNotContributing",reason="torn_down",scope="controller",transport="nvme-tcp",verdict="repaired"} 1`,
		`pathmend_volume_paths{state="expected",transport="nvme-tcp",volume_id="vol-a"} 2`,
		`pathmend_volume_paths{state="live",transport="nvme-tcp",volume_id="vol-a"} 2`,
		`pathmend_volume_paths{state="optimized",transport="nvme-tcp",volume_id="vol-a"} 1`,
		`pathmend_monitor_tick_duration_seconds_count 1`,
		`pathmend_monitor_processes_started_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Unstaged: the volume's series go away; the healthy node has no defects.
	r.set(t)
	r.m.Tick(context.Background())
	if body := scrape(t, m); strings.Contains(body, `volume_id="vol-a"`) || strings.Contains(body, "pathmend_defects{") {
		t.Errorf("series remain with nothing staged:\n%s", grep(body, "vol-a"))
	}
	r.set(t, rec("vol-b", nqnB, "127.0.0.3"))
	r.m.Tick(context.Background())
	body = scrape(t, m)
	if strings.Contains(body, `volume_id="vol-a"`) {
		t.Error("series of an unstaged volume remain")
	}
	if !strings.Contains(body, `volume_id="vol-b"`) {
		t.Error("series of the staged volume missing")
	}
	if strings.Contains(body, `pathmend_defects{`) {
		t.Errorf("defects reported on a healthy node:\n%s", grep(body, "pathmend_defects"))
	}
}

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
