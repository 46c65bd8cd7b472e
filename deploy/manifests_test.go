package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pathmend/pathmend/internal/testneed"
)

// TestManifests_DecodeStrictly decodes every document of every YAML file
// under deploy/ into its API type; an unknown field, a duplicate key, a
// wrong type or an unknown kind fails. Names must be valid object names.
func TestManifests_DecodeStrictly(t *testing.T) {
	files := manifestFiles(t)
	if len(files) == 0 {
		t.Fatal("no manifests found")
	}
	for _, f := range files {
		objs := loadFile(t, f)
		if len(objs) == 0 {
			t.Errorf("%s holds no document", f)
		}
		for _, o := range objs {
			if o.GVK.Kind == "Kustomization" {
				continue
			}
			if errs := validation.IsDNS1123Subdomain(o.Meta.Name); len(errs) > 0 {
				t.Errorf("%s: name %q: %v", o.Source, o.Meta.Name, errs)
			}
		}
	}
}

// TestDecodeStrict_RejectsUnknownFields proves the decoder is strict: a
// misspelt field in a manifest would otherwise be dropped silently, and
// the API server would run something else than what was reviewed.
func TestDecodeStrict_RejectsUnknownFields(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field":  "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: x\nspec:\n  attachRequierd: false\n",
		"duplicate key":   "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n  name: y\n",
		"wrong type":      "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\nautomountServiceAccountToken: \"no\"\n",
		"unknown kind":    "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: x\n",
		"nested misspelt": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          imagePullPolcy: Always\n",
	} {
		if _, err := decodeStrict(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestKustomizations_ListExistingFiles: every resource and patch a
// kustomization names exists, and every YAML file in a kustomization's
// directory is listed by it (a file nobody lists is never applied).
func TestKustomizations_ListExistingFiles(t *testing.T) {
	for _, dir := range kustomizationDirs(t) {
		k := loadFile(t, filepath.Join(dir, "kustomization.yaml"))[0].Obj.(*kustomization)
		listed := map[string]bool{"kustomization.yaml": true}
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
				t.Errorf("%s: resource %s: %v", dir, r, err)
			}
			listed[filepath.Clean(r)] = true
		}
		for _, p := range k.Patches {
			if _, err := os.Stat(filepath.Join(dir, p.Path)); err != nil {
				t.Errorf("%s: patch %s: %v", dir, p.Path, err)
			}
			listed[filepath.Clean(p.Path)] = true
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") && !listed[e.Name()] {
				t.Errorf("%s/%s is listed in no resources or patches of %s/kustomization.yaml", dir, e.Name(), dir)
			}
		}
	}
}

// TestRender_AppliesPatchesByMergeKey: the renderer merges a patch's
// containers and env by name, as kustomize does, instead of replacing
// the lists.
func TestRender_AppliesPatchesByMergeKey(t *testing.T) {
	base := loadInstall(t, "base")
	repair := loadInstall(t, "overlays/repair")
	pb, pr := base.container(t, pluginContainer), repair.container(t, pluginContainer)
	if len(repair.pod.Containers) != len(base.pod.Containers) {
		t.Fatalf("the overlay has %d containers, the base %d", len(repair.pod.Containers), len(base.pod.Containers))
	}
	if len(pr.Env) != len(pb.Env) || !slices.Equal(pr.Args, pb.Args) || pr.Image != pb.Image {
		t.Errorf("the overlay changed more than one env value:\n%s", cmp.Diff(pb, pr))
	}
}

// TestRender_MatchesKubectlKustomize compares the renderer with `kubectl
// kustomize` where kubectl is installed, object by object.
func TestRender_MatchesKubectlKustomize(t *testing.T) {
	kubectl := testneed.Tools(t, nil, "kubectl")[0]
	for _, dir := range kustomizationDirs(t) {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", dir).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			docs, err := splitDocuments(out)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]any{}
			for i, d := range docs {
				o, err := decodeStrict(fmt.Sprintf("kubectl kustomize %s#%d", dir, i), d)
				if err != nil {
					t.Fatal(err)
				}
				want[o.key()] = normalize(t, o.Obj)
			}
			got := map[string]any{}
			for _, o := range render(t, dir) {
				got[o.key()] = normalize(t, o.Obj)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("render differs from kubectl kustomize (-kubectl +render):\n%s", diff)
			}
		})
	}
}

// normalize returns an object as generic JSON with container env sorted
// by name: kustomize puts a patch's new env entries first, the API server
// keeps any order, and no env value here refers to another.
func normalize(t *testing.T, obj any) any {
	t.Helper()
	if p := podSpecOf(obj); p != nil {
		for i := range p.Containers {
			slices.SortFunc(p.Containers[i].Env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
		}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// podSpecOf returns the pod spec of a DaemonSet or Pod, nil for others.
func podSpecOf(obj any) *corev1.PodSpec {
	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		return &o.Spec.Template.Spec
	case *corev1.Pod:
		return &o.Spec
	}
	return nil
}
