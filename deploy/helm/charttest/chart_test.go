package charttest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../pathmend"
	deployDir = "../.."
	repoRoot  = "../../.."
)

// object is one rendered Kubernetes object, decoded generically.
type object = map[string]any

// key names an object the way kubectl does.
func key(o object) string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v %v %v/%v", o["apiVersion"], o["kind"], md["namespace"], md["name"])
}

// decode splits a multi-document YAML stream into objects by key.
func decode(t *testing.T, what string, stream []byte) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(stream), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, doc)
		}
		if o == nil {
			continue
		}
		k := key(o)
		if _, dup := out[k]; dup {
			t.Errorf("%s: %s twice", what, k)
		}
		out[k] = o
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// helmTemplate renders the chart with vals as `helm template pathmend
// deploy/helm/pathmend` does (a client-only dry-run install through the
// Helm SDK) and returns its objects.
func helmTemplate(t *testing.T, vals map[string]any) map[string]object {
	t.Helper()
	b, err := helmManifest(vals)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, "helm template", b)
}

func helmManifest(vals map[string]any) ([]byte, error) {
	kv, err := labKubeVersion()
	if err != nil {
		return nil, err
	}
	return helmManifestFor(kv, vals)
}

// labKubeVersion is the Kubernetes release the lab's cluster runs (the
// k8s.io/kubernetes version of hack/lab/kubelet/k8s/go.mod): `helm
// template` renders for the cluster the chart is installed in.
func labKubeVersion() (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "hack/lab/kubelet/k8s/go.mod"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s+k8s\.io/kubernetes (v\d+\.\d+\.\d+)\b`).FindSubmatch(b)
	if m == nil {
		return "", errors.New("hack/lab/kubelet/k8s/go.mod requires no k8s.io/kubernetes")
	}
	return string(m[1]), nil
}

// helmManifestFor renders the chart as `helm template --kube-version
// kubeVersion` does.
func helmManifestFor(kubeVersion string, vals map[string]any) ([]byte, error) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	cfg := action.NewConfiguration()
	cfg.Releases = storage.Init(driver.NewMemory())
	in := action.NewInstall(cfg)
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = "pathmend"
	in.Namespace = "pathmend"
	in.Replace = true
	in.KubeVersion = kv
	rel, err := in.Run(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm template: %w", err)
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("helm template: a %T, not a v1 release", rel)
	}
	return []byte(r.Manifest), nil
}

// kustomize renders a kustomization directory under deploy/ as `kubectl
// apply -k` does.
func kustomize(t *testing.T, dir string) map[string]object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(filepath.Join(deployDir, dir))
	if err != nil {
		t.Fatal(err)
	}
	rm, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	b, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, "kustomize "+dir, b)
}

// sameObjects compares two renderings object by object.
func sameObjects(t *testing.T, wantName string, want map[string]object, gotName string, got map[string]object) {
	t.Helper()
	keys := func(m map[string]object) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	if diff := cmp.Diff(keys(want), keys(got)); diff != "" {
		t.Errorf("objects differ (-%s +%s):\n%s", wantName, gotName, diff)
	}
	for k, w := range want {
		if g, ok := got[k]; ok {
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("%s differs (-%s +%s):\n%s", k, wantName, gotName, diff)
			}
		}
	}
}

// TestChart_DefaultsRenderTheRepairOverlay: `helm install` with the
// default values creates exactly the objects of `kubectl apply -k
// deploy/overlays/repair`, field for field.
func TestChart_DefaultsRenderTheRepairOverlay(t *testing.T) {
	sameObjects(t, "overlays/repair", kustomize(t, "overlays/repair"), "chart", helmTemplate(t, nil))
}

// TestChart_CompanionRendersTheCompanionOverlay: companion on and the
// node plugin off is deploy/overlays/companion; both on are the two
// installs side by side, sharing the namespace.
func TestChart_CompanionRendersTheCompanionOverlay(t *testing.T) {
	companion := kustomize(t, "overlays/companion")
	sameObjects(t, "overlays/companion", companion, "chart", helmTemplate(t, map[string]any{
		"nodePlugin": map[string]any{"enabled": false},
		"companion":  map[string]any{"enabled": true},
	}))
	both := kustomize(t, "overlays/repair")
	for k, o := range companion {
		both[k] = o
	}
	sameObjects(t, "repair + companion", both, "chart", helmTemplate(t, map[string]any{
		"companion": map[string]any{"enabled": true},
	}))
}

// TestChart_KubeVersion: the chart installs on the oldest Kubernetes
// docs/install.md names (1.25) and refuses an older one with Helm's clear
// error instead of rendering objects that cluster cannot take.
func TestChart_KubeVersion(t *testing.T) {
	if _, err := helmManifestFor("v1.25.0", nil); err != nil {
		t.Errorf("Kubernetes 1.25: %v", err)
	}
	_, err := helmManifestFor("v1.24.17", nil)
	if err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("Kubernetes 1.24: %v, want the chart's kubeVersion refusal", err)
	}
	install, err := os.ReadFile(filepath.Join(repoRoot, "docs/install.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(install), "Kubernetes 1.25 or later") {
		t.Error("docs/install.md no longer says Kubernetes 1.25 or later: move the chart's kubeVersion with it")
	}
}

// TestChart_Lint runs Helm's linter (strict: warnings fail) on the chart
// with its defaults and with every switch turned.
func TestChart_Lint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"companion only": {
			"nodePlugin": map[string]any{"enabled": false},
			"companion":  map[string]any{"enabled": true, "heal": "repair", "extraArgs": []any{"--nvme-reconnect"}},
		},
		"everything set": {
			"namespace":  map[string]any{"create": false, "name": "storage"},
			"kubeletDir": "/var/lib/k0s/kubelet/",
			"nodePlugin": map[string]any{"seLinuxMount": true},
			"heal":       allHealValues,
			"companion":  map[string]any{"enabled": true},
		},
	} {
		l := action.NewLint()
		l.Strict = true
		l.Namespace = "pathmend"
		res := l.Run([]string{chartDir}, vals)
		if res.TotalChartsLinted != 1 || len(res.Errors) > 0 {
			t.Errorf("%s: helm lint --strict: %d linted, %v", name, res.TotalChartsLinted, errors.Join(res.Errors...))
		}
		for _, m := range res.Messages {
			t.Logf("%s: %s", name, m)
		}
	}
}

// readVersion is deploy/VERSION.
func readVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestChart_VersionIsTheRelease: the chart is the release deploy/VERSION
// names (its version without the "v", appVersion with it) and runs that
// release's image unless told otherwise.
func TestChart_VersionIsTheRelease(t *testing.T) {
	version := readVersion(t)
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != strings.TrimPrefix(version, "v") || ch.Metadata.AppVersion != version {
		t.Errorf("Chart.yaml version %s, appVersion %s; deploy/VERSION is %s", ch.Metadata.Version, ch.Metadata.AppVersion, version)
	}
	images := func(objs map[string]object) []string {
		var out []string
		for _, o := range objs {
			b, _ := yaml.Marshal(o)
			for _, m := range regexp.MustCompile(`image: (\S+)`).FindAllStringSubmatch(string(b), -1) {
				out = append(out, m[1])
			}
		}
		return out
	}
	all := helmTemplate(t, map[string]any{"companion": map[string]any{"enabled": true}})
	n := 0
	for _, img := range images(all) {
		if strings.HasPrefix(img, "ghcr.io/pathmend/pathmend:") {
			n++
			if img != "ghcr.io/pathmend/pathmend:"+version {
				t.Errorf("image %s, want the release %s", img, version)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d pathmend images rendered, want 2 (node plugin, companion)", n)
	}
	own := helmTemplate(t, map[string]any{"image": map[string]any{"repository": "registry.example.com/pathmend", "tag": "v9.9.9-dev_abc"}})
	for _, img := range images(own) {
		if strings.Contains(img, "pathmend:") && img != "registry.example.com/pathmend:v9.9.9-dev_abc" {
			t.Errorf("with image values set, image %s", img)
		}
	}
}

// TestChart_KubeletDirMovesEveryPath: one value moves every path shared
// with kubelet — the five places a hand edit of the manifests must find.
func TestChart_KubeletDirMovesEveryPath(t *testing.T) {
	b, err := helmManifest(map[string]any{"kubeletDir": "/var/lib/k0s/kubelet/"})
	if err != nil {
		t.Fatal(err)
	}
	text := stripComments(string(b))
	if strings.Contains(text, "/var/lib/kubelet") {
		t.Errorf("/var/lib/kubelet still rendered:\n%s", text)
	}
	for _, want := range []string{
		"--kubelet-root=/var/lib/k0s/kubelet\n",
		"--kubelet-registration-path=/var/lib/k0s/kubelet/plugins/csi.pathmend.io/csi.sock\n",
		"mountPath: /var/lib/k0s/kubelet\n",
		"path: /var/lib/k0s/kubelet/plugins/csi.pathmend.io\n",
		"path: /var/lib/k0s/kubelet/plugins_registry\n",
		"path: /var/lib/k0s/kubelet\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q rendered", strings.TrimSpace(want))
		}
	}
}

// TestChart_SELinuxMount: seLinuxMount reaches the CSIDriver.
func TestChart_SELinuxMount(t *testing.T) {
	objs := helmTemplate(t, map[string]any{"nodePlugin": map[string]any{"seLinuxMount": true}})
	d := objs["storage.k8s.io/v1 CSIDriver <nil>/csi.pathmend.io"]
	if d == nil {
		t.Fatal("no CSIDriver rendered")
	}
	if got := d["spec"].(map[string]any)["seLinuxMount"]; got != true {
		t.Errorf("spec.seLinuxMount = %v", got)
	}
}

// TestChart_SchedulingValues: node selector (beside the Linux one every
// pod needs), tolerations, update strategy, metrics ports and namespace
// reach both DaemonSets.
func TestChart_SchedulingValues(t *testing.T) {
	objs := helmTemplate(t, map[string]any{
		"namespace":      map[string]any{"name": "storage", "create": false},
		"nodeSelector":   map[string]any{"storage.example.com/nvme": "true"},
		"tolerations":    []any{map[string]any{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}},
		"updateStrategy": map[string]any{"type": "OnDelete"},
		"nodePlugin":     map[string]any{"ports": map[string]any{"metrics": 19811, "healthz": 19810, "registrarHealthz": 19812}},
		"companion":      map[string]any{"enabled": true, "metricsPort": 19813},
	})
	for k := range objs {
		if strings.Contains(k, "Namespace") {
			t.Errorf("namespace.create=false rendered %s", k)
		}
	}
	for _, name := range []string{"pathmend-node", "pathmend-companion"} {
		ds := objs["apps/v1 DaemonSet storage/"+name]
		if ds == nil {
			t.Fatalf("no DaemonSet storage/%s", name)
		}
		b, _ := yaml.Marshal(ds)
		text := string(b)
		for _, want := range []string{"storage.example.com/nvme: \"true\"", "key: storage", "type: OnDelete"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: no %q", name, want)
			}
		}
		if !strings.Contains(text, "kubernetes.io/os: linux") {
			t.Errorf("%s: a node selector set dropped kubernetes.io/os: linux", name)
		}
	}
	b, _ := yaml.Marshal(objs["apps/v1 DaemonSet storage/pathmend-node"])
	for _, want := range []string{"]:19811", "containerPort: 19811", "127.0.0.1:19810", "port: 19810", "127.0.0.1:19812", "containerPort: 19812"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("pathmend-node: no %q", want)
		}
	}
	b, _ = yaml.Marshal(objs["apps/v1 DaemonSet storage/pathmend-companion"])
	if !bytes.Contains(b, []byte("]:19813")) || !bytes.Contains(b, []byte("containerPort: 19813")) {
		t.Error("pathmend-companion: metricsPort not rendered")
	}
}

// allHealValues sets every heal value (to a value other than pathmend's
// default).
var allHealValues = map[string]any{
	"mode":                  "observe",
	"monitorInterval":       "5s",
	"grace":                 "7s",
	"cooldown":              "3m",
	"maxScope":              "controller",
	"iscsiScope":            "all",
	"iscsiStuckThreshold":   "1m",
	"iscsidRestartCooldown": "20m",
	"connectTimeout":        "15s",
}

var (
	pathmendOnce sync.Once
	pathmendHelp string
	pathmendErr  error
)

// serveHelp builds pathmend from this checkout and returns `pathmend
// serve --help`.
func serveHelp(t *testing.T) string {
	t.Helper()
	pathmendOnce.Do(func() {
		bin := filepath.Join(os.TempDir(), fmt.Sprintf("pathmend-charttest-%d", os.Getpid()))
		defer os.Remove(bin)
		goBin := "go"
		if g := os.Getenv("GO"); g != "" {
			goBin = g
		}
		cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/pathmend")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			pathmendErr = fmt.Errorf("go build ./cmd/pathmend: %v\n%s", err, out)
			return
		}
		var stdout bytes.Buffer
		help := exec.Command(bin, "serve", "--help")
		help.Stdout, help.Stderr = &stdout, io.Discard
		if err := help.Run(); err != nil {
			pathmendErr = fmt.Errorf("pathmend serve --help: %v", err)
			return
		}
		pathmendHelp = stdout.String()
	})
	if pathmendErr != nil {
		t.Fatal(pathmendErr)
	}
	return pathmendHelp
}

// helpDefaults maps each flag of `pathmend serve --help` to its default.
func helpDefaults(help string) map[string]string {
	out := map[string]string{}
	flag := ""
	for _, line := range strings.Split(help, "\n") {
		if m := regexp.MustCompile(`^  --?(\S+)`).FindStringSubmatch(line); m != nil {
			flag = m[1]
			out[flag] = ""
			continue
		}
		if m := regexp.MustCompile(`\(default: (.*)\)$`).FindStringSubmatch(line); m != nil && flag != "" {
			out[flag] = m[1]
		}
	}
	return out
}

// TestChart_HealValuesArePathmendsFlags: every heal value renders a flag
// `pathmend serve` has, with the value given, and the default values.yaml
// states for it (the "(…)" its comment ends with) is pathmend's.
func TestChart_HealValuesArePathmendsFlags(t *testing.T) {
	defaults := helpDefaults(serveHelp(t))
	b, err := helmManifest(map[string]any{"heal": allHealValues})
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s+- --([a-z-]+)=(.*)$`).FindAllStringSubmatch(string(b), -1) {
		rendered[m[1]] = m[2]
	}
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// "  # --flag: …(default).\n…  key: """
	documented := regexp.MustCompile(`(?s)  # --([a-z-]+):[^\n]*(?:\n  #[^\n]*)*\(([^()]*)\)\.\n  ([a-zA-Z]+): ""`).FindAllStringSubmatch(string(values), -1)
	if len(documented) != len(allHealValues)-1 {
		t.Errorf("values.yaml documents %d heal flags, the test sets %d", len(documented), len(allHealValues)-1)
	}
	for _, d := range documented {
		flag, def, key := d[1], d[2], d[3]
		want, ok := defaults[flag]
		if !ok {
			t.Errorf("heal.%s: pathmend serve has no flag --%s", key, flag)
			continue
		}
		if def != want {
			t.Errorf("heal.%s: values.yaml says --%s defaults to %s, pathmend says %s", key, flag, def, want)
		}
		if got := rendered[flag]; got != allHealValues[key] {
			t.Errorf("heal.%s=%v rendered --%s=%q", key, allHealValues[key], flag, got)
		}
	}
	for flag := range rendered {
		if _, ok := defaults[flag]; !ok && flag != "csi-address" && flag != "kubelet-registration-path" && flag != "plugin-registration-path" && flag != "http-endpoint" && flag != "probe-timeout" && flag != "v" {
			t.Errorf("rendered --%s, which pathmend serve does not have", flag)
		}
	}
	if !strings.Contains(string(b), "value: \"observe\"") {
		t.Error("heal.mode=observe not rendered into PATHMEND_HEAL")
	}
}

// valueLeaves lists the values a user sets, as dotted paths: maps are
// walked, except those whose keys are Kubernetes' own (resources, node
// selector, update strategy), which are one value each.
func valueLeaves(prefix string, v map[string]any) []string {
	var out []string
	for k, x := range v {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		m, ok := x.(map[string]any)
		if !ok || k == "resources" || k == "nodeSelector" || k == "updateStrategy" {
			out = append(out, p)
			continue
		}
		out = append(out, valueLeaves(p, m)...)
	}
	sort.Strings(out)
	return out
}

// TestChart_InstallDocsEveryValue: docs/install.md's Helm table names every
// value of values.yaml (as `path` or, after the first of a group, as
// `.last`).
func TestChart_InstallDocsEveryValue(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/install.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Install with Helm\n")
	if !ok {
		t.Fatal("docs/install.md has no section Install with Helm")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	leaves := valueLeaves("", ch.Values)
	if len(leaves) < 20 {
		t.Fatalf("values.yaml has %d values: %v", len(leaves), leaves)
	}
	for _, p := range leaves {
		last := p[strings.LastIndex(p, ".")+1:]
		if !strings.Contains(section, "`"+p+"`") && !strings.Contains(section, "`."+last+"`") && !strings.Contains(section, "`"+p+"`,") {
			t.Errorf("docs/install.md, Install with Helm: value %s is not documented", p)
		}
	}
}
