package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// object is one decoded YAML document.
type object struct {
	// Source is "file#n": the file relative to deploy/ and the document's
	// index in it, for messages.
	Source string
	GVK    schema.GroupVersionKind
	Meta   metav1.ObjectMeta
	// Obj is a pointer to the typed object, e.g. *appsv1.DaemonSet.
	Obj any
	// Raw is the document as written (YAML or JSON).
	Raw []byte
}

// key identifies an object the way kubectl does.
func (o object) key() string {
	return fmt.Sprintf("%s/%s %s/%s", o.GVK.Group, o.GVK.Kind, o.Meta.Namespace, o.Meta.Name)
}

// kinds maps every kind the manifests may hold to its Go type. A document of
// any other kind fails to load: add it here, with its real API type, when a
// manifest needs it.
var kinds = map[schema.GroupVersionKind]func() any{
	{Version: "v1", Kind: "Namespace"}:                                            func() any { return &corev1.Namespace{} },
	{Version: "v1", Kind: "ServiceAccount"}:                                       func() any { return &corev1.ServiceAccount{} },
	{Version: "v1", Kind: "Secret"}:                                               func() any { return &corev1.Secret{} },
	{Version: "v1", Kind: "PersistentVolume"}:                                     func() any { return &corev1.PersistentVolume{} },
	{Version: "v1", Kind: "PersistentVolumeClaim"}:                                func() any { return &corev1.PersistentVolumeClaim{} },
	{Version: "v1", Kind: "Pod"}:                                                  func() any { return &corev1.Pod{} },
	{Group: "apps", Version: "v1", Kind: "DaemonSet"}:                             func() any { return &appsv1.DaemonSet{} },
	{Group: "storage.k8s.io", Version: "v1", Kind: "CSIDriver"}:                   func() any { return &storagev1.CSIDriver{} },
	{Group: "storage.k8s.io", Version: "v1", Kind: "StorageClass"}:                func() any { return &storagev1.StorageClass{} },
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"}:       func() any { return &prometheusRule{} },
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PodMonitor"}:           func() any { return &podMonitor{} },
	{Group: "kustomize.config.k8s.io", Version: "v1beta1", Kind: "Kustomization"}: func() any { return &kustomization{} },
}

// kustomization is the part of kustomize's Kustomization the manifests use.
// Decoding is strict, so a kustomization that starts using another field
// (images, namePrefix, …) fails here until render learns it; render would
// otherwise quietly produce something kustomize does not.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	// Resources are files, or directories holding a kustomization.yaml.
	Resources []string `json:"resources,omitempty"`
	// Patches are strategic-merge patches; each names its target by
	// apiVersion, kind, name and namespace.
	Patches []kustomizePatch `json:"patches,omitempty"`
}

type kustomizePatch struct {
	Path string `json:"path"`
}

// splitDocuments returns the YAML documents of data, without the empty
// ones (a file may open with a comment and a separator).
func splitDocuments(data []byte) ([][]byte, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(d)
		if err != nil {
			return nil, err
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue
		}
		docs = append(docs, d)
	}
}

// decodeStrict decodes one document into the Go type of its apiVersion and
// kind. An unknown field, a duplicate key or a value of the wrong type is
// an error, as it is for the API server's strict field validation.
func decodeStrict(source string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
	newObj, ok := kinds[gvk]
	if !ok {
		return object{}, fmt.Errorf("%s: apiVersion %q kind %q is not a kind the manifests may hold (see kinds)", source, tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s: %s: %w", source, gvk.Kind, err)
	}
	o := object{Source: source, GVK: gvk, Obj: obj, Raw: doc}
	if m, ok := obj.(metav1.Object); ok {
		o.Meta = metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace(), Labels: m.GetLabels()}
	}
	return o, nil
}

// loadFile decodes every document of a file under deploy/.
func loadFile(t *testing.T, rel string) []object {
	t.Helper()
	data, err := os.ReadFile(rel)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := splitDocuments(data)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	var out []object
	for i, d := range docs {
		o, err := decodeStrict(fmt.Sprintf("%s#%d", filepath.ToSlash(rel), i), d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// manifestFiles lists every YAML file under deploy/, skipping testdata
// (inputs of other tools, not Kubernetes objects) and the Helm chart
// (templates, tested by deploy/helm/charttest against these manifests).
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || p == "helm") {
			return fs.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// kustomizationDirs lists every directory under deploy/ with a
// kustomization.yaml.
func kustomizationDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, f := range manifestFiles(t) {
		if filepath.Base(f) == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	return dirs
}

// render builds the objects of a kustomization directory as `kustomize
// build` does for the fields kustomization allows: resources in order
// (directories recursively), then each strategic-merge patch applied to the
// one object it names.
func render(t *testing.T, dir string) []object {
	t.Helper()
	ks := loadFile(t, filepath.Join(dir, "kustomization.yaml"))
	if len(ks) != 1 {
		t.Fatalf("%s/kustomization.yaml: want one document, got %d", dir, len(ks))
	}
	k := ks[0].Obj.(*kustomization)
	var objs []object
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s/kustomization.yaml: resource %s: %v", dir, r, err)
		}
		if fi.IsDir() {
			objs = append(objs, render(t, p)...)
			continue
		}
		for _, o := range loadFile(t, p) {
			if o.GVK.Kind == "Kustomization" {
				t.Fatalf("%s: a kustomization is a resource directory, not a resource file", o.Source)
			}
			objs = append(objs, o)
		}
	}
	for _, pt := range k.Patches {
		patches := loadFile(t, filepath.Join(dir, pt.Path))
		for _, patch := range patches {
			i := slices.IndexFunc(objs, func(o object) bool { return o.key() == patch.key() && o.GVK == patch.GVK })
			if i < 0 {
				t.Fatalf("%s: patch targets %s, which %s does not hold", patch.Source, patch.key(), dir)
			}
			objs[i] = applyPatch(t, objs[i], patch)
		}
	}
	return objs
}

// applyPatch applies a strategic-merge patch with the merge keys of the
// target's Go type (containers and env merge by name), as kustomize does.
func applyPatch(t *testing.T, target, patch object) object {
	t.Helper()
	orig, err := json.Marshal(target.Obj)
	if err != nil {
		t.Fatal(err)
	}
	pj, err := yaml.YAMLToJSON(patch.Raw)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, pj, kinds[target.GVK]())
	if err != nil {
		t.Fatalf("%s: %v", patch.Source, err)
	}
	out, err := decodeStrict(target.Source+"+"+patch.Source, merged)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// find returns the one object of a kind in objs.
func find[T any](t *testing.T, objs []object) *T {
	t.Helper()
	var found []*T
	for _, o := range objs {
		if v, ok := o.Obj.(*T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, found %d", zero, len(found))
	}
	return found[0]
}

// all returns every object of a kind in objs.
func all[T any](objs []object) []*T {
	var found []*T
	for _, o := range objs {
		if v, ok := o.Obj.(*T); ok {
			found = append(found, v)
		}
	}
	return found
}
