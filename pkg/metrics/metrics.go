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
	"strconv"
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
	filesystemState   *prometheus.GaugeVec
	defects           *prometheus.GaugeVec
	repairs           *prometheus.CounterVec
	sessionRecoveries *prometheus.CounterVec
	tickDuration      prometheus.Histogram
	processes         prometheus.Counter
	unreadable        prometheus.Gauge
	intents           *prometheus.CounterVec
	uevents           *prometheus.CounterVec
	ueventLosses      *prometheus.CounterVec
	eventRefreshes    *prometheus.CounterVec
	eventLatency      prometheus.Histogram

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
		filesystemState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volume_filesystem_state",
			Help: "The state of a staged filesystem volume's filesystem, one series per state (healthy, errors, read_only, shutdown, unknown): 1 for the state it is in, 0 for the others. read_only: it takes no writes (ext4 after an error); shutdown: every read and write fails (XFS); errors: errors recorded, still writable; unknown: its health cannot be read.",
		}, []string{"volume_id", "state"}),
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
		uevents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "uevents_total",
			Help: "Kernel uevents received, by subsystem (nvme, nvme-subsystem, block, scsi, iscsi_session, iscsi_connection, other) and whether they may change a path pathmend keeps (relevant: true, false).",
		}, []string{"subsystem", "relevant"}),
		ueventLosses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "uevent_losses_total",
			Help: "Times kernel uevents were lost, by reason (socket: the receive buffer overflowed; queue: the loop fell behind; truncated, malformed, receive). Each loss makes the loop read every target again at once.",
		}, []string{"reason"}),
		eventRefreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "event_refreshes_total",
			Help: "Reads the loop made because of kernel uevents, by scope: target (the objects of one target an event named), full (every target, after a loss).",
		}, []string{"scope"}),
		eventLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "event_decision_seconds",
			Help:    "From the receipt of the first kernel uevent of a burst for a target to the loop's decision on it (the target read and planned, its job started or found unneeded).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	m.reg.MustRegister(m.volumePaths, m.stagedReplaced, m.filesystemState, m.defects, m.repairs, m.sessionRecoveries, m.tickDuration, m.processes, m.unreadable, m.intents,
		m.uevents, m.ueventLosses, m.eventRefreshes, m.eventLatency,
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

// SetFilesystemState records the state of a staged volume's filesystem:
// 1 on state's series, 0 on every other of states (the closed set,
// pkg/fshealth.States).
func (m *Metrics) SetFilesystemState(volumeID, state string, states []string) {
	if m == nil {
		return
	}
	for _, s := range states {
		v := 0.0
		if s == state {
			v = 1
		}
		m.filesystemState.WithLabelValues(volumeID, s).Set(v)
	}
}

// ForgetFilesystem deletes the filesystem-state series of a volume that
// is no longer a staged filesystem volume.
func (m *Metrics) ForgetFilesystem(volumeID string) {
	if m == nil {
		return
	}
	m.filesystemState.DeletePartialMatch(prometheus.Labels{"volume_id": volumeID})
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

// ueventSubsystems are the subsystems counted under their own name; every
// other one is "other", so the label stays a closed set.
var ueventSubsystems = map[string]bool{"nvme": true, "nvme-subsystem": true, "block": true, "scsi": true, "iscsi_session": true, "iscsi_connection": true}

// ObserveUevent counts one kernel uevent received (uevent.Metrics).
func (m *Metrics) ObserveUevent(subsystem string, relevant bool) {
	if m == nil {
		return
	}
	if !ueventSubsystems[subsystem] {
		subsystem = "other"
	}
	m.uevents.WithLabelValues(subsystem, strconv.FormatBool(relevant)).Inc()
}

// ObserveUeventLoss counts one loss of kernel uevents (uevent.Metrics).
func (m *Metrics) ObserveUeventLoss(reason string) {
	if m == nil {
		return
	}
	m.ueventLosses.WithLabelValues(reason).Inc()
}

// ObserveEventRefresh counts one read the loop made because of kernel
// uevents: scope "target" or "full".
func (m *Metrics) ObserveEventRefresh(scope string) {
	if m == nil {
		return
	}
	m.eventRefreshes.WithLabelValues(scope).Inc()
}

// ObserveEventDecision records the time from an event's receipt to the
// loop's decision on its target.
func (m *Metrics) ObserveEventDecision(d time.Duration) {
	if m == nil {
		return
	}
	m.eventLatency.Observe(d.Seconds())
}
