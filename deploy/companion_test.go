package deploy

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/pathmend/pathmend/pkg/heal"
)

// companionInstalls are the kustomizations of companion mode
// (docs/companion.md), each with the heal mode it runs. They are not node
// plugin installs: the tests of installs (registrar, CSIDriver, kubelet
// directory) do not apply to them.
var companionInstalls = map[string]string{
	"overlays/companion": "observe",
}

// companionFlags builds pathmend and returns the flags `pathmend companion
// --help` lists.
func companionFlags(t *testing.T) map[string]string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pathmend")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/pathmend/pathmend/cmd/pathmend").CombinedOutput(); err != nil {
		t.Fatalf("build pathmend: %v\n%s", err, out)
	}
	var stdout bytes.Buffer
	cmd := exec.Command(bin, "companion", "--help")
	cmd.Stdout = &stdout
	if err := cmd.Run(); err != nil {
		t.Fatalf("pathmend companion --help: %v", err)
	}
	return parseUsage(stdout.String())
}

// TestCompanion_IsNoCSIPlugin: no CSIDriver, no registrar or probe
// sidecar, no CSI socket, no kubelet directory: companion mode mounts
// nothing and serves no CSI. One container runs `pathmend companion` with
// flags it defines, in the heal mode the install states.
func TestCompanion_IsNoCSIPlugin(t *testing.T) {
	known := companionFlags(t)
	for dir, mode := range companionInstalls {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			for _, o := range objs {
				switch o.GVK.Kind {
				case "Namespace", "ServiceAccount", "DaemonSet":
				default:
					t.Errorf("%s %s: companion mode needs no such object", o.GVK.Kind, o.key())
				}
			}
			ds := find[appsv1.DaemonSet](t, objs)
			pod := ds.Spec.Template.Spec
			if len(pod.Containers) != 1 || pod.Containers[0].Name != pluginContainer {
				t.Fatalf("containers %v, want one named %s", pod.Containers, pluginContainer)
			}
			c := pod.Containers[0]
			fl, pos := flags(t, &c)
			if !slices.Equal(pos, []string{"companion"}) {
				t.Errorf("positional args %q, want [companion]", pos)
			}
			for name := range fl {
				if _, ok := known[name]; !ok {
					t.Errorf("--%s: pathmend companion has no such flag", name)
				}
			}
			if fl["heal"] != mode {
				t.Errorf("--heal=%q, want %q", fl["heal"], mode)
			}
			if _, err := heal.ParseMode(fl["heal"]); err != nil {
				t.Error(err)
			}
			for _, v := range pod.Volumes {
				if v.HostPath != nil && (strings.HasPrefix(v.HostPath.Path, "/var/lib/kubelet") || v.HostPath.Path == "/etc/nvme") {
					t.Errorf("volume %s mounts %s: companion mode needs no kubelet directory and no host NQN of its own", v.Name, v.HostPath.Path)
				}
			}
			for _, m := range c.VolumeMounts {
				if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
					t.Errorf("mount %s propagates: companion mode mounts nothing", m.Name)
				}
			}
			if !pod.HostNetwork || !pod.HostPID || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Error("companion mode connects NVMe/TCP in the host's network namespace and runs iscsiadm through nsenter: it needs hostNetwork, hostPID and privileged")
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("readiness probe %+v, want /healthz", c.ReadinessProbe)
			}
		})
	}
}

// TestCompanion_SharesTheNodePluginsStateDirAndNamespace: one owner per
// kernel object needs the node plugin's records, so companion mode's
// state dir is the same host path; the namespace object is identical, so
// both installs apply side by side; the DaemonSet and its account are
// companion mode's own, and its metrics port is not one of the plugin's.
func TestCompanion_SharesTheNodePluginsStateDirAndNamespace(t *testing.T) {
	base := loadInstall(t, "base")
	for dir := range companionInstalls {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			ds := find[appsv1.DaemonSet](t, objs)
			if ds.Name == base.ds.Name {
				t.Errorf("DaemonSet %s has the node plugin's name", ds.Name)
			}
			if ds.Spec.Template.Spec.ServiceAccountName == base.pod.ServiceAccountName {
				t.Errorf("service account %s is the node plugin's", ds.Spec.Template.Spec.ServiceAccountName)
			}
			stateDir := func(pod *corev1.PodSpec) string {
				for _, v := range pod.Volumes {
					if v.Name == "state-dir" && v.HostPath != nil {
						return v.HostPath.Path
					}
				}
				return ""
			}
			if got, want := stateDir(&ds.Spec.Template.Spec), stateDir(base.pod); got == "" || got != want {
				t.Errorf("state dir %q, the node plugin's %q", got, want)
			}
			ns := find[corev1.Namespace](t, objs)
			if diff := cmp.Diff(find[corev1.Namespace](t, base.objs), ns); diff != "" {
				t.Errorf("namespace differs from the node plugin's (-plugin +companion):\n%s", diff)
			}
			ports := map[int32]bool{}
			for _, c := range base.pod.Containers {
				for _, p := range c.Ports {
					ports[p.ContainerPort] = true
				}
			}
			for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
				if ports[p.ContainerPort] {
					t.Errorf("port %d is the node plugin's too (both pods use the host network)", p.ContainerPort)
				}
			}
		})
	}
}
