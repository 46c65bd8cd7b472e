package monitor

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/volume"
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

// stagedFunc adapts a function that cannot fail to a StagedDevicer.
func stagedFunc(f func([]volume.Record) map[string]volume.StagedDevice) StagedDevicer {
	return func(recs []volume.Record) (map[string]volume.StagedDevice, error) { return f(recs), nil }
}

// Every staged volume has a pathmend_volume_staged_device_replaced
// series: 1 while the device its users hold is not the one its namespace
// has in the tick's read (compared by number), 0 once it is (restaged),
// none once it is unstaged. It is reported in observe mode too: it is a
// report, not a repair.
func TestTick_StagedDeviceReplacedMetric(t *testing.T) {
	r := newRig(t, heal.ModeObserve, nil)
	m := metrics.New()
	r.m.deps.Metrics = m
	r.connectAged(t, nqnA, "127.0.0.1")
	r.connectAged(t, nqnB, "127.0.0.3")
	_, devA, _ := r.k.Head(nqnA, 1)
	_, devB, _ := r.k.Head(nqnB, 1)
	numA, _ := volume.ParseDeviceNumber(devA)
	numB, _ := volume.ParseDeviceNumber(devB)
	held := map[string]volume.DeviceNumber{"vol-a": {Major: 259, Minor: 999}, "vol-b": numB} // vol-a: a removed device
	r.m.deps.Staged = stagedFunc(func(recs []volume.Record) map[string]volume.StagedDevice {
		out := map[string]volume.StagedDevice{}
		for _, rec := range recs {
			out[rec.VolumeID] = volume.StagedDevice{Device: volume.BlockDevice{Name: "nvme0n1", Number: held[rec.VolumeID]}, From: "the staging mount at " + rec.StagingPath}
		}
		return out
	})
	recs := []volume.Record{rec("vol-a", nqnA, "127.0.0.1"), rec("vol-b", nqnB, "127.0.0.3")}
	r.set(t, recs...)
	rep := r.m.Tick(context.Background())
	if len(rep.Replaced) != 1 || rep.Replaced[0] != "vol-a" {
		t.Errorf("replaced = %v", rep.Replaced)
	}
	body := scrape(t, m)
	for _, want := range []string{
		`pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-a"} 1`,
		`pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-b"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(body, "staged_device"))
		}
	}
	held["vol-a"] = numA // restaged
	r.set(t, recs[:1]...)
	r.m.Tick(context.Background())
	body = scrape(t, m)
	if !strings.Contains(body, `pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-a"} 0`) || strings.Contains(body, `volume_id="vol-b"`) {
		t.Errorf("after the restage of vol-a and the unstage of vol-b:\n%s", grep(body, "staged_device"))
	}
}
