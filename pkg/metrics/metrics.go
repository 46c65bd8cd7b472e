// Package metrics holds pathmend's Prometheus collectors and the HTTP
// listener that serves them with /healthz.
//
// Every metric is documented in docs/metrics.md. Label cardinality is
// bounded: per-volume series are deleted when a volume is unstaged
// (ForgetVolume); kinds, scopes, verdicts and reason classes (heal.Class,
// never the free-text reason) are closed sets.
package metrics

import (
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/scrub"
)

const namespace = "pathmend"

// Metrics is the set of pathmend collectors on their own registry. It is
// safe for concurrent use; a nil *Metrics records nothing, so callers in
// tests need no registry.
type Metrics struct {
	reg *prometheus.Registry

	volumePaths       *prometheus.GaugeVec
	stagedReplaced    *prometheus.GaugeVec
	defects           *prometheus.GaugeVec
	repairs           *prometheus.CounterVec
	sessionRecoveries *prometheus.CounterVec
	tickDuration      prometheus.Histogram
	processes         prometheus.Counter
	unreadable        prometheus.Gauge
	intents           *prometheus.CounterVec

	lastTick atomic.Int64 // unix nanoseconds of the end of the last tick
}

// New builds the collectors and registers them, with the Go runtime and
// process collectors, on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		volumePaths: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volume_paths",
			Help: "Paths of a staged volume by state: expected (the volume context lists them), live (connected with a usable leg), optimized (ANA optimized).",
		}, []string{"volume_id", "transport", "state"}),
		stagedReplaced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volume_staged_device_replaced",
			Help: "1 when the block device a staged volume's users hold (its staging mount, or the device node of a block volume's publications) is no longer the volume's device: the kernel removed and re-created it. I/O through it fails until the pods are restarted. 0 otherwise.",
		}, []string{"volume_id", "transport"}),
		defects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "defects",
			Help: "Defects found by the last diagnosis, by transport and kind.",
		}, []string{"transport", "kind"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "repairs_total",
			Help: "Heal verdicts by transport, defect kind, scope, verdict (repaired, observed, deferred, refused, failed) and reason class.",
		}, []string{"transport", "kind", "scope", "verdict", "reason"}),
		sessionRecoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "iscsi_session_recoveries_total",
			Help: "iSCSI session kicks by method (logout_login, iscsid_restart) and result (logged_in, failed).",
		}, []string{"method", "result"}),
		tickDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "monitor_tick_duration_seconds",
			Help:    "Duration of one monitor tick: read sysfs, heal, reconcile every staged volume.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		processes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "monitor_processes_started_total",
			Help: "Processes the monitor started. Stays 0 on a healthy node: diagnosis reads sysfs only.",
		}),
		unreadable: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "state_records_unreadable",
			Help: "Staged-volume record files the last scan could not read. Nothing of a target such a file may belong to is torn down until it is readable or removed.",
		}),
		intents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "intent_reconciliations_total",
			Help: "Verdicts on interrupted intents by record state (attaching, detaching) and verdict (rolled back, finished, kept, refused, failed, observed).",
		}, []string{"state", "verdict"}),
	}
	m.reg.MustRegister(m.volumePaths, m.stagedReplaced, m.defects, m.repairs, m.sessionRecoveries, m.tickDuration, m.processes, m.unreadable, m.intents,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry the collectors live on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format, every
// label value scrubbed of the secrets the process has seen (a volume ID
// is the caller's to choose).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(scrubbed{m.reg}, promhttp.HandlerOpts{Registry: m.reg})
}

// scrubbed gathers what its registry holds and scrubs every label value.
type scrubbed struct{ prometheus.Gatherer }

func (s scrubbed) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := s.Gatherer.Gather()
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if v := scrub.String(lp.GetValue()); v != lp.GetValue() {
					lp.Value = &v
				}
			}
		}
	}
	return mfs, err
}

// SetVolumePaths records the path counts of one staged volume.
func (m *Metrics) SetVolumePaths(volumeID, transport string, expected, live, optimized int) {
	if m == nil {
		return
	}
	m.volumePaths.WithLabelValues(volumeID, transport, "expected").Set(float64(expected))
	m.volumePaths.WithLabelValues(volumeID, transport, "live").Set(float64(live))
	m.volumePaths.WithLabelValues(volumeID, transport, "optimized").Set(float64(optimized))
}

// SetStagedDeviceReplaced records whether a staged volume's staged device
// was replaced by the kernel.
func (m *Metrics) SetStagedDeviceReplaced(volumeID, transport string, replaced bool) {
	if m == nil {
		return
	}
	v := 0.0
	if replaced {
		v = 1
	}
	m.stagedReplaced.WithLabelValues(volumeID, transport).Set(v)
}

// ForgetStagedDevice deletes the staged-device series of an unstaged
// volume.
func (m *Metrics) ForgetStagedDevice(volumeID string) {
	if m == nil {
		return
	}
	m.stagedReplaced.DeletePartialMatch(prometheus.Labels{"volume_id": volumeID})
}

// ForgetVolume deletes every series of an unstaged volume.
func (m *Metrics) ForgetVolume(volumeID string) {
	if m == nil {
		return
	}
	m.volumePaths.DeletePartialMatch(prometheus.Labels{"volume_id": volumeID})
}

// SetDefects replaces the current defect counts of one transport: kinds
// absent from counts drop to no series.
func (m *Metrics) SetDefects(transport string, counts map[heal.Kind]int) {
	if m == nil {
		return
	}
	m.defects.DeletePartialMatch(prometheus.Labels{"transport": transport})
	for k, n := range counts {
		m.defects.WithLabelValues(transport, string(k)).Set(float64(n))
	}
}

// ObserveOutcomes counts heal verdicts.
func (m *Metrics) ObserveOutcomes(transport string, outs []heal.Outcome) {
	if m == nil {
		return
	}
	for _, o := range outs {
		m.repairs.WithLabelValues(transport, string(o.Defect.Kind), o.Defect.Scope.String(), string(o.Verdict), string(o.Class)).Inc()
	}
}

// ObserveSessionRecovery counts one iSCSI session kick.
func (m *Metrics) ObserveSessionRecovery(method, result string) {
	if m == nil {
		return
	}
	m.sessionRecoveries.WithLabelValues(method, result).Inc()
}

// ObserveTick records a finished monitor tick.
func (m *Metrics) ObserveTick(d time.Duration, end time.Time) {
	if m == nil {
		return
	}
	m.tickDuration.Observe(d.Seconds())
	m.lastTick.Store(end.UnixNano())
}

// LastTick is when the last monitor tick ended; zero before the first.
func (m *Metrics) LastTick() time.Time {
	if m == nil || m.lastTick.Load() == 0 {
		return time.Time{}
	}
	return time.Unix(0, m.lastTick.Load())
}

// SetUnreadableRecords records how many staged-volume record files the
// last scan could not read.
func (m *Metrics) SetUnreadableRecords(n int) {
	if m == nil {
		return
	}
	m.unreadable.Set(float64(n))
}

// ObserveIntent counts one verdict on an interrupted intent: state is the
// record's (attaching, detaching), verdict the reconciliation's.
func (m *Metrics) ObserveIntent(state, verdict string) {
	if m == nil {
		return
	}
	m.intents.WithLabelValues(state, strings.ReplaceAll(verdict, " ", "_")).Inc()
}

// ProcessStarted counts one process the monitor started.
func (m *Metrics) ProcessStarted() {
	if m == nil {
		return
	}
	m.processes.Inc()
}
