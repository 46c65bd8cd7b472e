package deploy

import (
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// install is one rendered kustomization.
type install struct {
	dir    string
	objs   []object
	ds     *appsv1.DaemonSet
	driver *storagev1.CSIDriver
	pod    *corev1.PodSpec
}

func loadInstall(t *testing.T, dir string) install {
	t.Helper()
	objs := render(t, dir)
	in := install{dir: dir, objs: objs, ds: find[appsv1.DaemonSet](t, objs), driver: find[storagev1.CSIDriver](t, objs)}
	in.pod = &in.ds.Spec.Template.Spec
	return in
}

// forEachInstall runs f on every rendered kustomization.
func forEachInstall(t *testing.T, f func(t *testing.T, in install)) {
	for _, dir := range slices.Sorted(maps.Keys(installs)) {
		t.Run(dir, func(t *testing.T) { f(t, loadInstall(t, dir)) })
	}
}

func (in install) container(t *testing.T, name string) *corev1.Container {
	t.Helper()
	for i := range in.pod.Containers {
		if in.pod.Containers[i].Name == name {
			return &in.pod.Containers[i]
		}
	}
	t.Fatalf("%s: the DaemonSet has no container %q", in.dir, name)
	return nil
}

func (in install) volume(name string) (corev1.Volume, bool) {
	for _, v := range in.pod.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

// hostPathOf returns the host path that p inside container c is, through
// the mount holding p with the longest mount path, and that mount.
func (in install) hostPathOf(t *testing.T, c *corev1.Container, p string) (string, corev1.VolumeMount) {
	t.Helper()
	best := -1
	for i, m := range c.VolumeMounts {
		if (p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")) &&
			(best < 0 || len(m.MountPath) > len(c.VolumeMounts[best].MountPath)) {
			best = i
		}
	}
	if best < 0 {
		t.Fatalf("%s: container %s: %s is on no volume mount", in.dir, c.Name, p)
	}
	m := c.VolumeMounts[best]
	v, ok := in.volume(m.Name)
	if !ok || v.HostPath == nil {
		t.Fatalf("%s: container %s: %s is on volume %q, which is not a hostPath volume", in.dir, c.Name, p, m.Name)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, m.MountPath), "/")
	return path.Join(v.HostPath.Path, m.SubPath, rel), m
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// flags parses a container's args, every flag written -name=value or
// --name=value, and expands $(VAR) references the way kubelet does from
// the container's env: a literal value is substituted, a fieldRef becomes
// "<fieldPath>". Positional arguments are returned in order.
func flags(t *testing.T, c *corev1.Container) (map[string]string, []string) {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "<" + e.ValueFrom.FieldRef.FieldPath + ">"
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	fl := map[string]string{}
	var pos []string
	for _, arg := range c.Args {
		var bad []string
		a := arg
		a = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				// kubelet would pass "$(NAME)" on literally.
				bad = append(bad, name)
			}
			return v
		})
		if len(bad) > 0 {
			t.Errorf("container %s: arg %q refers to %v, which its env does not define", c.Name, arg, bad)
		}
		if !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			// A separate value would be read as a positional argument by
			// some parsers and as the flag's value by others.
			t.Errorf("container %s: write %q as -name=value", c.Name, a)
			continue
		}
		if _, dup := fl[name]; dup {
			t.Errorf("container %s: flag %s given twice", c.Name, name)
		}
		fl[name] = value
	}
	return fl, pos
}

// mustFlag returns a flag the container must set.
func mustFlag(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	fl, _ := flags(t, c)
	v, ok := fl[name]
	if !ok {
		t.Fatalf("container %s does not set --%s", c.Name, name)
	}
	return v
}

func readVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("VERSION %q is not a release tag like v0.1.0", v)
	}
	return v
}
