package deploy

import (
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/pathmend/pathmend/pkg/driver"
)

// Names the manifests and these tests agree on.
const (
	imageRepo          = "ghcr.io/pathmend/pathmend"
	pluginContainer    = "pathmend"
	registrarContainer = "node-driver-registrar"
	livenessContainer  = "livenessprobe"
)

// installs maps every kustomization directory to the heal mode its
// DaemonSet must run with. The base runs observe so that applying it
// directly never tears down a path.
var installs = map[string]string{
	"base":             "observe",
	"overlays/observe": "observe",
	"overlays/repair":  "repair",
}

// TestInstalls_AreTheKustomizations keeps installs in step with the
// directories: a new overlay must say which heal mode it runs.
func TestInstalls_AreTheKustomizations(t *testing.T) {
	got := kustomizationDirs(t)
	for i := range got {
		got[i] = path.Clean(strings.ReplaceAll(got[i], string(os.PathSeparator), "/"))
	}
	slices.Sort(got)
	all := maps.Clone(installs)
	maps.Copy(all, companionInstalls)
	if want := slices.Sorted(maps.Keys(all)); !slices.Equal(got, want) {
		t.Errorf("kustomization directories %v, installs %v", got, want)
	}
}

// TestInstall_ObjectsLiveInThePluginNamespace: the namespaced objects sit
// in the namespace the install creates, the DaemonSet runs as the install's
// service account.
func TestInstall_ObjectsLiveInThePluginNamespace(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		ns := find[corev1.Namespace](t, in.objs)
		if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
			t.Errorf("namespace %s: pod-security enforce level %q; the plugin pod needs privileged", ns.Name, got)
		}
		for _, o := range in.objs {
			switch o.GVK.Kind {
			case "Namespace", "CSIDriver":
				if o.Meta.Namespace != "" {
					t.Errorf("%s: cluster-scoped, but has namespace %q", o.Source, o.Meta.Namespace)
				}
			default:
				if o.Meta.Namespace != ns.Name {
					t.Errorf("%s: namespace %q, want %q", o.Source, o.Meta.Namespace, ns.Name)
				}
			}
		}
		sa := find[corev1.ServiceAccount](t, in.objs)
		if in.pod.ServiceAccountName != sa.Name {
			t.Errorf("pod runs as service account %q, the install creates %q", in.pod.ServiceAccountName, sa.Name)
		}
	})
}

// TestInstall_NeedsNoAPIAccess: pathmend reads and writes no API object,
// so no credential reaches the pod. The loader admits no RBAC kind.
func TestInstall_NeedsNoAPIAccess(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		sa := find[corev1.ServiceAccount](t, in.objs)
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Error("the service account must set automountServiceAccountToken: false")
		}
		if in.pod.AutomountServiceAccountToken == nil || *in.pod.AutomountServiceAccountToken {
			t.Error("the pod must set automountServiceAccountToken: false")
		}
		for _, v := range in.pod.Volumes {
			if v.Projected != nil {
				t.Errorf("volume %s: a projected volume may carry a token; the plugin needs none", v.Name)
			}
		}
	})
}

// TestInstall_PodRunsOnEveryNodeInTheHostNamespaces checks the pod-level
// settings docs/security.md explains.
func TestInstall_PodRunsOnEveryNodeInTheHostNamespaces(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		p := in.pod
		if !p.HostNetwork {
			t.Error("hostNetwork: NVMe/TCP connections and iSCSI sessions are made in the host's network namespace")
		}
		if !p.HostPID {
			t.Error("hostPID: nsenter --target 1 needs the host's PID 1")
		}
		if p.PriorityClassName != "system-node-critical" {
			t.Errorf("priorityClassName %q, want system-node-critical", p.PriorityClassName)
		}
		if got := p.NodeSelector[corev1.LabelOSStable]; got != "linux" || len(p.NodeSelector) != 1 {
			t.Errorf("nodeSelector %v, want only %s: linux (the image and sysfs, nvme-fabrics, iscsiadm are Linux only)", p.NodeSelector, corev1.LabelOSStable)
		}
		if !slices.ContainsFunc(p.Tolerations, func(tl corev1.Toleration) bool {
			return tl.Key == "" && tl.Operator == corev1.TolerationOpExists && tl.Effect == ""
		}) {
			t.Error("no toleration of every taint: a tainted node would run pods whose volumes nobody stages")
		}
		sel, err := metav1.LabelSelectorAsSelector(in.ds.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(in.ds.Spec.Template.Labels)) {
			t.Errorf("selector %s does not match the pod template's labels %v", sel, in.ds.Spec.Template.Labels)
		}
		if s := in.ds.Spec.UpdateStrategy; s.Type != appsv1.RollingUpdateDaemonSetStrategyType {
			t.Errorf("update strategy %q, want RollingUpdate", s.Type)
		}
		if got := in.ds.Spec.Template.Annotations["kubectl.kubernetes.io/default-container"]; got != pluginContainer {
			t.Errorf("default container %q, want %q (kubectl exec … -- pathmend diagnose)", got, pluginContainer)
		}
	})
}

// TestInstall_RegistrarRegistersTheSocketPathmendServes: kubelet learns
// the socket from --kubelet-registration-path, a host path; pathmend,
// the registrar and livenessprobe each name it inside their own container.
// All four must be one file, in kubelet's plugin directory for the driver.
func TestInstall_RegistrarRegistersTheSocketPathmendServes(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		pm := in.container(t, pluginContainer)
		sock, err := driver.ParseEndpoint(mustFlag(t, pm, "endpoint"))
		if err != nil {
			t.Fatal(err)
		}
		hostSock, _ := in.hostPathOf(t, pm, sock)
		for _, name := range []string{registrarContainer, livenessContainer} {
			c := in.container(t, name)
			if got, _ := in.hostPathOf(t, c, mustFlag(t, c, "csi-address")); got != hostSock {
				t.Errorf("%s --csi-address is host path %s; pathmend serves %s", name, got, hostSock)
			}
		}
		reg := in.container(t, registrarContainer)
		if got := mustFlag(t, reg, "kubelet-registration-path"); got != hostSock {
			t.Errorf("--kubelet-registration-path=%s; pathmend's socket is %s on the host", got, hostSock)
		}
		kubeletDir := in.kubeletDir(t)
		if want := path.Join(kubeletDir, "plugins", in.driver.Name, path.Base(sock)); hostSock != want {
			t.Errorf("socket on the host at %s, want %s (kubelet's plugin directory for %s)", hostSock, want, in.driver.Name)
		}
		if got, _ := in.hostPathOf(t, reg, mustFlag(t, reg, "plugin-registration-path")); got != path.Join(kubeletDir, "plugins_registry") {
			t.Errorf("registrar's registration directory is host path %s, want %s", got, path.Join(kubeletDir, "plugins_registry"))
		}
	})
}

// kubeletDir is the host path pathmend mounts with Bidirectional
// propagation; there must be exactly one.
func (in install) kubeletDir(t *testing.T) string {
	t.Helper()
	pm := in.container(t, pluginContainer)
	var dirs []string
	for _, m := range pm.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			h, _ := in.hostPathOf(t, pm, m.MountPath)
			dirs = append(dirs, h)
		}
	}
	if len(dirs) != 1 {
		t.Fatalf("pathmend has %d Bidirectional mounts %v, want one: kubelet's directory", len(dirs), dirs)
	}
	return dirs[0]
}

// TestInstall_KubeletDirIsBidirectionalOnPrivilegedPathmend: mounts made
// at staging and target paths must reach the host and every pod, and
// kubelet names those paths as host paths, so pathmend sees kubelet's
// directory at the same path. Only a privileged container may propagate
// mounts to the host.
func TestInstall_KubeletDirIsBidirectionalOnPrivilegedPathmend(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		pm := in.container(t, pluginContainer)
		if sc := pm.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Error("pathmend must be privileged (mount propagation, /dev/nvme-fabrics, sysfs writes, nsenter)")
		}
		dir := in.kubeletDir(t)
		for _, m := range pm.VolumeMounts {
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional && m.MountPath != dir {
				t.Errorf("kubelet's directory %s is mounted at %s; staging paths would not resolve", dir, m.MountPath)
			}
		}
		if dir != "/var/lib/kubelet" {
			t.Errorf("kubelet directory %s; the manifests and docs/install.md assume /var/lib/kubelet", dir)
		}
		for _, c := range in.pod.Containers {
			if c.Name == pluginContainer {
				continue
			}
			for _, m := range c.VolumeMounts {
				if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
					t.Errorf("container %s: mount %s is Bidirectional; only pathmend mounts", c.Name, m.MountPath)
				}
			}
			if sc := c.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("container %s: a sidecar runs unprivileged without privilege escalation", c.Name)
			}
		}
	})
}

// TestInstall_PathmendSeesTheHostsPaths: the directories pathmend's flags
// name are the host's own, at the same paths, so what pathmend reads and
// writes is what the node's tools and a restarted plugin see.
func TestInstall_PathmendSeesTheHostsPaths(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		pm := in.container(t, pluginContainer)
		fl, _ := flags(t, pm)
		dirs := map[string]string{
			"state-dir":    fl["state-dir"],
			"sys-root":     fl["sys-root"],
			"dev-root":     fl["dev-root"],
			"hostnqn-file": path.Dir(fl["hostnqn-file"]),
			"hostid-file":  path.Dir(fl["hostid-file"]),
		}
		for flag, dir := range dirs {
			if dir == "" || dir == "." {
				t.Errorf("pathmend does not set --%s", flag)
				continue
			}
			host, m := in.hostPathOf(t, pm, dir)
			if host != dir {
				t.Errorf("--%s: %s in the container is %s on the host", flag, dir, host)
			}
			if m.ReadOnly {
				t.Errorf("--%s: %s is mounted read-only; pathmend writes there", flag, dir)
			}
		}
		// Records and the host identity must survive the first start on a
		// node that has neither directory yet.
		for _, flag := range []string{"state-dir", "hostnqn-file"} {
			_, m := in.hostPathOf(t, pm, dirs[flag])
			v, _ := in.volume(m.Name)
			if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("--%s: volume %s must be a hostPath of type DirectoryOrCreate", flag, v.Name)
			}
		}
		prefix := strings.Fields(fl["host-command-prefix"])
		if slices.Contains(prefix, "nsenter") && !(slices.Contains(prefix, "--target") && slices.Contains(prefix, "1") && in.pod.HostPID) {
			t.Errorf("--host-command-prefix=%q must enter PID 1's namespaces with hostPID", fl["host-command-prefix"])
		}
	})
}

// TestInstall_ImagesArePinned: pathmend runs the VERSION release, every
// image names a tag, and a node never pulls on each restart.
func TestInstall_ImagesArePinned(t *testing.T) {
	version := readVersion(t)
	forEachInstall(t, func(t *testing.T, in install) {
		if got, want := in.container(t, pluginContainer).Image, imageRepo+":"+version; got != want {
			t.Errorf("pathmend image %s, want %s (deploy/VERSION)", got, want)
		}
		for _, c := range in.pod.Containers {
			_, tag, ok := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
			if !ok || tag == "" || tag == "latest" {
				t.Errorf("container %s: image %s has no release tag", c.Name, c.Image)
			}
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("container %s: imagePullPolicy %q, want IfNotPresent", c.Name, c.ImagePullPolicy)
			}
		}
	})
}

// TestInstall_HealMode: each install runs the heal mode it is named for.
func TestInstall_HealMode(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		if got := mustFlag(t, in.container(t, pluginContainer), "heal"); got != installs[in.dir] {
			t.Errorf("--heal=%s, want %s", got, installs[in.dir])
		}
	})
}

// TestInstall_NodeIDIsTheNodeName: NodeGetInfo reports the Kubernetes node
// name, from the downward API.
func TestInstall_NodeIDIsTheNodeName(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		if got := mustFlag(t, in.container(t, pluginContainer), "node-id"); got != "<spec.nodeName>" {
			t.Errorf("--node-id expands to %q, want the node name (fieldRef spec.nodeName)", got)
		}
	})
}

// TestInstall_ContainersRequestResources: every container requests CPU and
// memory and caps its memory.
func TestInstall_ContainersRequestResources(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		for _, c := range in.pod.Containers {
			r := c.Resources
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := r.Requests[res]; !ok || q.IsZero() {
					t.Errorf("container %s requests no %s", c.Name, res)
				}
			}
			lim, ok := r.Limits[corev1.ResourceMemory]
			if !ok {
				t.Errorf("container %s has no memory limit", c.Name)
				continue
			}
			if req := r.Requests[corev1.ResourceMemory]; lim.Cmp(req) < 0 {
				t.Errorf("container %s: memory limit %s below its request %s", c.Name, lim.String(), req.String())
			}
			if _, ok := r.Limits[corev1.ResourceCPU]; ok {
				t.Errorf("container %s: a CPU limit throttles the plugin mid-RPC; request CPU only", c.Name)
			}
		}
	})
}

// TestInstall_VolumesAndMountsAgree: every mount names a declared volume,
// every volume is mounted, no container mounts two volumes at one path.
func TestInstall_VolumesAndMountsAgree(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		used := map[string]bool{}
		for _, c := range in.pod.Containers {
			paths := map[string]bool{}
			for _, m := range c.VolumeMounts {
				if _, ok := in.volume(m.Name); !ok {
					t.Errorf("container %s mounts undeclared volume %s", c.Name, m.Name)
				}
				if paths[m.MountPath] {
					t.Errorf("container %s mounts two volumes at %s", c.Name, m.MountPath)
				}
				paths[m.MountPath] = true
				used[m.Name] = true
			}
		}
		for _, v := range in.pod.Volumes {
			if !used[v.Name] {
				t.Errorf("volume %s is mounted by no container", v.Name)
			}
			if v.HostPath != nil && !path.IsAbs(v.HostPath.Path) {
				t.Errorf("volume %s: hostPath %q is not absolute", v.Name, v.HostPath.Path)
			}
		}
	})
}

// TestInstall_CSIDriver: the object kubelet and the controllers consult
// for csi.pathmend.io.
func TestInstall_CSIDriver(t *testing.T) {
	def := serveFlags(t)["driver-name"]
	forEachInstall(t, func(t *testing.T, in install) {
		d := in.driver
		name := def
		if v, ok := flagsOf(t, in.container(t, pluginContainer))["driver-name"]; ok {
			name = v
		}
		if d.Name != name {
			t.Errorf("CSIDriver %s, but pathmend serves driver %s", d.Name, name)
		}
		s := d.Spec
		if s.AttachRequired == nil || *s.AttachRequired {
			t.Error("attachRequired must be false: pathmend has no ControllerPublishVolume")
		}
		if s.PodInfoOnMount == nil || *s.PodInfoOnMount {
			t.Error("podInfoOnMount must be false: pathmend needs nothing about the pod")
		}
		if !slices.Equal(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
			t.Errorf("volumeLifecycleModes %v, want [Persistent]", s.VolumeLifecycleModes)
		}
		if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.FileFSGroupPolicy {
			t.Error("fsGroupPolicy must be File")
		}
	})
}

func flagsOf(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	fl, _ := flags(t, c)
	return fl
}
