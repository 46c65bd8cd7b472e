package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

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
var scrapeLabels = []string{"instance", "job", "namespace", "pod", "container", "endpoint", "node"}

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
			if len(sels) == 0 {
				t.Errorf("alert %s reads no pathmend metric", r.Alert)
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

// TestPodMonitor_ScrapesThePlugin: the example PodMonitor selects the
// plugin's pods in their namespace and scrapes pathmend's metrics port.
func TestPodMonitor_ScrapesThePlugin(t *testing.T) {
	pm := find[podMonitor](t, loadExamples(t))
	in := loadInstall(t, "base")
	if pm.Namespace != in.ds.Namespace {
		t.Errorf("PodMonitor in namespace %q; it selects pods of its own namespace, the plugin's is %q", pm.Namespace, in.ds.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(in.ds.Spec.Template.Labels)) {
		t.Errorf("selector %s does not match the plugin's pods %v", sel, in.ds.Spec.Template.Labels)
	}
	c := in.container(t, pluginContainer)
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("want one endpoint, got %d", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	port := in.probePort(t, c, intstr.FromString(ep.Port))
	if !containsListener(in.listeners(t), pluginContainer, port) {
		t.Errorf("endpoint port %q is not pathmend's metrics listener", ep.Port)
	}
	if ep.Path != "/metrics" {
		t.Errorf("endpoint path %q, want /metrics", ep.Path)
	}
	var node bool
	for _, r := range ep.Relabelings {
		node = node || (r.TargetLabel == "node" && slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_node_name"}))
	}
	if !node {
		t.Error("no relabeling to a node label; the alerts name the node with it")
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
