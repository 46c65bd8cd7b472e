package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/pathmend/pathmend/internal/testneed"
	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/metrics"
)

// The Prometheus Operator's types are not in k8s.io/api; these mirror the
// part of monitoring.coreos.com/v1 the examples use. Decoding is strict,
// so a field outside this part fails until it is added here.

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

// rule is one alerting or recording rule; its JSON is also the Prometheus
// rule-file format promtool reads.
type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port,omitempty"`
			Path        string `json:"path,omitempty"`
			Interval    string `json:"interval,omitempty"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels,omitempty"`
				Separator    string   `json:"separator,omitempty"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
				Regex        string   `json:"regex,omitempty"`
				Replacement  string   `json:"replacement,omitempty"`
				Action       string   `json:"action,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// scrapeLabels are the labels a series gains when the example PodMonitor
// scrapes it: the Prometheus Operator's target labels and the node label
// its relabeling adds.
var scrapeLabels = []string{"instance", "job", "namespace", "pod", "container", "endpoint", "node", "component"}

// scrapeJob is the job label of the example PodMonitor's targets: the
// Prometheus Operator names it <namespace>/<PodMonitor name>.
func scrapeJob(pm *podMonitor) string { return pm.Namespace + "/" + pm.Name }

// upRE finds the selectors of Prometheus's own up series in an alert.
var upRE = regexp.MustCompile(`\bup\s*\{([^}]*)\}`)

// closedLabels are labels whose values pathmend takes from a fixed set; an
// alert matching another value would never fire.
var closedLabels = []string{"state", "verdict", "reason"}

// metricFamily is what an alert may select from one of pathmend's metrics.
type metricFamily struct {
	name   string              // the family's name, without a histogram's suffix
	typ    string              // HISTOGRAM, COUNTER, GAUGE
	labels map[string][]string // label name → values seen
}

// pathmendMetrics exercises every collector of pkg/metrics once and
// returns what the registry exposes, so alerts are checked against the
// metrics the binary serves, not against a copy of their names. Verdicts
// come from pkg/heal's constants, path states from SetVolumePaths.
func pathmendMetrics(t *testing.T) map[string]metricFamily {
	t.Helper()
	m := metrics.New()
	m.SetVolumePaths("pv-1", "nvme-tcp", 2, 1, 1)
	m.SetStagedDeviceReplaced("pv-1", "nvme-tcp", true)
	states := make([]string, len(fshealth.States))
	for i, st := range fshealth.States {
		states[i] = string(st)
	}
	m.SetFilesystemState("pv-1", string(fshealth.ReadOnly), states)
	m.SetDefects("nvme-tcp", map[heal.Kind]int{heal.NoNamespace: 1})
	var outs []heal.Outcome
	for _, v := range []heal.Verdict{heal.Repaired, heal.Observed, heal.Deferred, heal.Refused, heal.Failed} {
		for _, c := range heal.Classes() {
			outs = append(outs, heal.Outcome{Defect: heal.Defect{Kind: heal.NoNamespace, Scope: heal.ScopeSubsystem}, Verdict: v, Class: c, Reason: "reason: detail"})
		}
	}
	m.ObserveOutcomes("nvme-tcp", outs)
	m.ObserveSessionRecovery("logout_login", "failed")
	m.ObserveTick(time.Millisecond, time.Now())
	m.ProcessStarted()
	m.SetUnreadableRecords(1)
	m.ObserveIntent("attaching", "rolled back")
	m.ObserveIntent("detaching", "failed")
	m.ObserveUevent("nvme", true)
	m.ObserveUeventLoss("socket")
	m.ObserveEventRefresh("target")
	m.ObserveEventDecision(time.Millisecond)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metricFamily{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "pathmend_") {
			continue
		}
		mf := metricFamily{name: f.GetName(), typ: f.GetType().String(), labels: map[string][]string{}}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(mf.labels[l.GetName()], l.GetValue()) {
					mf.labels[l.GetName()] = append(mf.labels[l.GetName()], l.GetValue())
				}
			}
		}
		out[f.GetName()] = mf
		if mf.typ == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+suffix] = mf
			}
		}
	}
	return out
}

func loadAlerts(t *testing.T) *prometheusRule {
	t.Helper()
	return find[prometheusRule](t, loadExamples(t))
}

var (
	selectorRE = regexp.MustCompile(`\b(pathmend_[a-zA-Z0-9_]+)\s*(\{([^}]*)\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	groupingRE = regexp.MustCompile(`\b(on|ignoring|by|without)\s*\(([^)]*)\)`)
	labelRefRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	durationRE = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
)

// TestAlerts_SelectWhatPathmendExports: every metric an alert reads is one
// pkg/metrics registers, with labels it has (or the scrape adds), and a
// matcher on a closed label uses a value pathmend emits; templates refer
// only to labels the alert's series carry.
func TestAlerts_SelectWhatPathmendExports(t *testing.T) {
	fams := pathmendMetrics(t)
	names := map[string]bool{}
	for _, g := range loadAlerts(t).Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || !strings.HasPrefix(r.Alert, "Pathmend") {
				t.Errorf("group %s: rule %q: every rule is an alert named Pathmend…", g.Name, r.Alert)
			}
			if names[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			names[r.Alert] = true
			have := slices.Clone(scrapeLabels)
			sels := selectorRE.FindAllStringSubmatch(r.Expr, -1)
			if len(sels) == 0 && !upRE.MatchString(r.Expr) {
				t.Errorf("alert %s reads no pathmend metric and not the up series of its targets", r.Alert)
			}
			for _, s := range sels {
				f, ok := fams[s[1]]
				if !ok {
					t.Errorf("alert %s: pathmend exports no metric %s", r.Alert, s[1])
					continue
				}
				for l := range f.labels {
					have = append(have, l)
				}
				for _, m := range matcherRE.FindAllStringSubmatch(s[3], -1) {
					vals, ok := f.labels[m[1]]
					switch {
					case !ok && !slices.Contains(scrapeLabels, m[1]):
						t.Errorf("alert %s: %s has no label %s", r.Alert, s[1], m[1])
					case m[2] == "=" && slices.Contains(closedLabels, m[1]) && !slices.Contains(vals, m[3]):
						t.Errorf("alert %s: %s{%s=%q} never exists; values are %v", r.Alert, s[1], m[1], m[3], vals)
					}
				}
			}
			for _, g := range groupingRE.FindAllStringSubmatch(r.Expr, -1) {
				for _, l := range strings.Split(g[2], ",") {
					if l = strings.TrimSpace(l); l != "" && !slices.Contains(have, l) {
						t.Errorf("alert %s: %s(%s): no series of the alert has label %s", r.Alert, g[1], g[2], l)
					}
				}
			}
			for _, text := range r.Annotations {
				for _, ref := range labelRefRE.FindAllStringSubmatch(text, -1) {
					if !slices.Contains(have, ref[1]) {
						t.Errorf("alert %s: annotation uses $labels.%s, which its series do not carry", r.Alert, ref[1])
					}
				}
			}
		}
	}
	for _, want := range []string{"PathmendVolumeDegraded", "PathmendRepairFailed", "PathmendRepairRefused"} {
		if !names[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// TestAlerts_AreActionable: each alert has a severity, a summary, a
// description and a runbook section that exists in docs/operations.md.
func TestAlerts_AreActionable(t *testing.T) {
	ops, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(ops))
	const runbook = "https://github.com/pathmend/pathmend/blob/main/docs/operations.md#"
	for _, g := range loadAlerts(t).Spec.Groups {
		for _, r := range g.Rules {
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("alert %s: severity %q", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s", r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbook)
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is not a section of docs/operations.md", r.Alert, r.Annotations["runbook_url"])
			}
			if r.For != "" && !durationRE.MatchString(r.For) {
				t.Errorf("alert %s: for %q is not a Prometheus duration", r.Alert, r.For)
			}
		}
	}
}

// headingAnchors returns the GitHub anchors of a Markdown file's headings.
func headingAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

// TestAlerts_PromtoolRules checks the rules with promtool and runs the
// unit tests in testdata/alerts.promtest.yaml (series in, alerts out),
// where promtool is installed.
func TestAlerts_PromtoolRules(t *testing.T) {
	promtool := testneed.Tools(t, map[string]string{"promtool": "prometheus"}, "promtool")[0]
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": loadAlerts(t).Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("testdata/alerts.promtest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.promtest.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts.promtest.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPodMonitor_ScrapesThePluginAndTheCompanion: the example PodMonitor
// selects the node plugin's pods and companion mode's in their namespace
// and scrapes pathmend's metrics port of each; its relabelings give the
// node and component labels the alerts name.
func TestPodMonitor_ScrapesThePluginAndTheCompanion(t *testing.T) {
	pm := find[podMonitor](t, loadExamples(t))
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("want one endpoint, got %d", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	base := loadInstall(t, "base")
	dirs := []string{"base"}
	for dir := range companionInstalls {
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		ds := find[appsv1.DaemonSet](t, render(t, dir))
		if pm.Namespace != ds.Namespace {
			t.Errorf("%s: PodMonitor in namespace %q; it selects pods of its own namespace, the DaemonSet's is %q", dir, pm.Namespace, ds.Namespace)
		}
		if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("%s: selector %s does not match the pods %v", dir, sel, ds.Spec.Template.Labels)
		}
		in := install{ds: ds, pod: &ds.Spec.Template.Spec}
		c := in.container(t, pluginContainer)
		port := in.probePort(t, c, intstr.FromString(ep.Port))
		var listens bool
		if dir == "base" {
			listens = containsListener(base.listeners(t), pluginContainer, port)
		} else {
			listens = strings.HasSuffix(mustFlag(t, c, "metrics-address"), fmt.Sprintf(":%d", port))
		}
		if !listens {
			t.Errorf("%s: endpoint port %q (%d) is not pathmend's metrics listener", dir, ep.Port, port)
		}
	}
	if ep.Path != "/metrics" {
		t.Errorf("endpoint path %q, want /metrics", ep.Path)
	}
	relabeled := map[string]string{}
	for _, r := range ep.Relabelings {
		if len(r.SourceLabels) == 1 && (r.Action == "" || r.Action == "replace") {
			relabeled[r.TargetLabel] = r.SourceLabels[0]
		}
	}
	want := map[string]string{"node": "__meta_kubernetes_pod_node_name", "component": "__meta_kubernetes_pod_label_app_kubernetes_io_component"}
	if diff := cmp.Diff(want, relabeled); diff != "" {
		t.Errorf("relabelings (-want +got); the alerts name the node and the component with them:\n%s", diff)
	}
	// No other pod of the namespace is scraped as pathmend.
	if sel.Matches(labels.Set{"app.kubernetes.io/name": "pathmend"}) {
		t.Errorf("selector %s matches a pod with no component", sel)
	}
}

// TestAlerts_ScrapeAlertsWatchThePodMonitorsTargets: the alerts for a
// pathmend that is absent or not scraped select up{job=…} of the example
// PodMonitor's targets, so they watch what the other alerts read; one
// fires per node (up == 0), one when there is no target at all (absent),
// and one for a node with none.
func TestAlerts_ScrapeAlertsWatchThePodMonitorsTargets(t *testing.T) {
	pm := find[podMonitor](t, loadExamples(t))
	job := `job="` + scrapeJob(pm) + `"`
	found := map[string]bool{}
	for _, g := range loadAlerts(t).Spec.Groups {
		for _, r := range g.Rules {
			ups := upRE.FindAllStringSubmatch(r.Expr, -1)
			for _, u := range ups {
				if strings.TrimSpace(u[1]) != job {
					t.Errorf("alert %s selects up{%s}, want up{%s} (the PodMonitor's targets)", r.Alert, u[1], job)
				}
			}
			if len(ups) == 0 {
				continue
			}
			switch {
			case strings.Contains(r.Expr, "absent("):
				found["absent"] = true
			case strings.Contains(r.Expr, "== 0"):
				found["down"] = true
				if !strings.Contains(r.Annotations["summary"], "$labels.node") {
					t.Errorf("alert %s: the summary does not name the node", r.Alert)
				}
			case strings.Contains(r.Expr, "kube_node_info"):
				found["node"] = true
			}
		}
	}
	for _, k := range []string{"absent", "down", "node"} {
		if !found[k] {
			t.Errorf("no scrape alert of kind %q", k)
		}
	}
}

var reasonValueRE = regexp.MustCompile(`\breason(?:="|: )([^"\n]*)`)

// TestAlerts_ReasonValuesAreClasses: every reason an alert rule or its
// promtool test names is a class the code emits (heal.Classes), so the
// tests feed series pathmend can produce.
func TestAlerts_ReasonValuesAreClasses(t *testing.T) {
	classes := map[string]bool{}
	for _, c := range heal.Classes() {
		classes[string(c)] = true
	}
	n := 0
	for _, f := range []string{"examples/prometheusrule.yaml", "testdata/alerts.promtest.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range reasonValueRE.FindAllStringSubmatch(string(b), -1) {
			n++
			if !classes[m[1]] {
				t.Errorf("%s: reason %q is not a reason class (docs/metrics.md#reason-classes)", f, m[1])
			}
		}
	}
	if n == 0 {
		t.Error("no reason value found: the alert tests no longer cover a refusal")
	}
}
