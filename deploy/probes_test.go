package deploy

import (
	"net"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// listenFlag names, per container, the flag that opens its HTTP listener.
var listenFlag = map[string]string{
	pluginContainer:    "metrics-address",
	livenessContainer:  "http-endpoint",
	registrarContainer: "http-endpoint",
}

// healthzBound is how long pathmend's /healthz lets its check run
// (pkg/metrics); a probe must wait longer than that for the answer.
const healthzBound = 5 * time.Second

// registrarHealthzBound: node-driver-registrar's /healthz is a stat of
// its registration socket, answered at once.
const registrarHealthzBound = time.Second

// sidecarDefaultPorts are ports the CSI sidecars document as defaults or
// examples. On the host network another CSI driver's pod on the same node
// likely holds them.
var sidecarDefaultPorts = map[int32]string{
	9808: "livenessprobe's default --http-endpoint port",
	9809: "node-driver-registrar's documented health port",
	8080: "node-driver-registrar's documented --http-endpoint example",
}

// listener is an address a container listens on, from its flags.
type listener struct {
	container string
	host      string
	port      int32
}

// listeners returns every HTTP listener the pod's containers open.
func (in install) listeners(t *testing.T) []listener {
	t.Helper()
	var ls []listener
	for _, c := range in.pod.Containers {
		addr, ok := flagsOf(t, &c)[listenFlag[c.Name]]
		if !ok || addr == "" {
			continue
		}
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("container %s: --%s=%s: %v", c.Name, listenFlag[c.Name], addr, err)
		}
		port, err := strconv.ParseInt(p, 10, 32)
		if err != nil {
			t.Fatalf("container %s: --%s=%s: port: %v", c.Name, listenFlag[c.Name], addr, err)
		}
		ls = append(ls, listener{container: c.Name, host: host, port: int32(port)})
	}
	return ls
}

// TestInstall_PortsAreWhatContainersOpen: each declared port is opened by
// its container's flags, and each listener is declared (the scheduler
// keeps two pods on the host network from wanting one port).
func TestInstall_PortsAreWhatContainersOpen(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		ls := in.listeners(t)
		names := map[string]bool{}
		for _, c := range in.pod.Containers {
			for _, p := range c.Ports {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					t.Errorf("container %s: port name %q: %v", c.Name, p.Name, errs)
				}
				if names[p.Name] {
					t.Errorf("port name %s declared twice", p.Name)
				}
				names[p.Name] = true
				if !containsListener(ls, c.Name, p.ContainerPort) {
					t.Errorf("container %s declares port %d, which its flags do not open", c.Name, p.ContainerPort)
				}
			}
		}
		for _, l := range ls {
			if _, ok := in.declaredPort(l.container, l.port); !ok {
				t.Errorf("container %s listens on %d without declaring it", l.container, l.port)
			}
		}
	})
}

// TestInstall_PortsAvoidSidecarDefaultsOnTheHostNetwork: every listener
// of the pod is a port of the node; none may be a port other CSI drivers'
// sidecars hold by default, and no two may share one.
func TestInstall_PortsAvoidSidecarDefaultsOnTheHostNetwork(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		if !in.pod.HostNetwork {
			t.Skip("not on the host network")
		}
		seen := map[int32]string{}
		for _, l := range in.listeners(t) {
			if why, bad := sidecarDefaultPorts[l.port]; bad {
				t.Errorf("container %s listens on %d, %s", l.container, l.port, why)
			}
			if other, dup := seen[l.port]; dup {
				t.Errorf("containers %s and %s both listen on %d", other, l.container, l.port)
			}
			seen[l.port] = l.container
		}
		if _, ok := seen[in.probePort(t, in.container(t, registrarContainer), intstr.FromString("registrar-hz"))]; !ok {
			t.Error("node-driver-registrar opens no --http-endpoint")
		}
	})
}

// TestInstall_RegistrarIsRestartedWhenItsSocketIsGone: the registrar
// serves /healthz (registration socket present) and a livenessProbe on it
// restarts the registrar, which registers again, when kubelet's plugin
// directory lost the socket.
func TestInstall_RegistrarIsRestartedWhenItsSocketIsGone(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		reg := in.container(t, registrarContainer)
		if reg.LivenessProbe == nil || reg.LivenessProbe.HTTPGet == nil {
			t.Fatal("node-driver-registrar has no HTTP livenessProbe")
		}
		port := in.probePort(t, reg, reg.LivenessProbe.HTTPGet.Port)
		if !containsListener(in.listeners(t), registrarContainer, port) {
			t.Errorf("registrar liveness probe on %d, not the registrar's --http-endpoint", port)
		}
	})
}

func containsListener(ls []listener, container string, port int32) bool {
	for _, l := range ls {
		if l.container == container && l.port == port {
			return true
		}
	}
	return false
}

func (in install) declaredPort(container string, port int32) (corev1.ContainerPort, bool) {
	for _, c := range in.pod.Containers {
		if c.Name != container {
			continue
		}
		for _, p := range c.Ports {
			if p.ContainerPort == port {
				return p, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// TestInstall_ProbesReachAListener: every probe is an HTTP GET of
// /healthz on a port some container of the pod listens on, at an address
// kubelet reaches (kubelet probes the pod IP, the node's own with
// hostNetwork, unless the probe names a host), and waits longer for the
// answer than the listener takes to give it. Liveness goes through the
// livenessprobe sidecar (the CSI Probe RPC, answered during a NodeStage);
// readiness through pathmend's own /healthz.
func TestInstall_ProbesReachAListener(t *testing.T) {
	forEachInstall(t, func(t *testing.T, in install) {
		ls := in.listeners(t)
		pm := in.container(t, pluginContainer)
		if pm.LivenessProbe == nil || pm.ReadinessProbe == nil {
			t.Fatal("pathmend needs a liveness and a readiness probe")
		}
		for _, c := range in.pod.Containers {
			for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
				if p == nil {
					continue
				}
				// A probe restarts the container it sits on, so a
				// sidecar's may only check that sidecar itself.
				if c.Name != pluginContainer && (kind != "liveness" || !containsListener(ls, c.Name, in.probePort(t, &c, p.HTTPGet.Port))) {
					t.Errorf("container %s: %s probe on a sidecar that does not check the sidecar's own listener", c.Name, kind)
				}
				g := p.HTTPGet
				if g == nil {
					t.Errorf("container %s: %s probe is not an HTTP GET", c.Name, kind)
					continue
				}
				if g.Path != "/healthz" {
					t.Errorf("container %s: %s probe path %q, want /healthz", c.Name, kind, g.Path)
				}
				port := in.probePort(t, &c, g.Port)
				var l *listener
				for i := range ls {
					if ls[i].port == port {
						l = &ls[i]
					}
				}
				if l == nil {
					t.Errorf("container %s: %s probe on port %d, where nothing listens", c.Name, kind, port)
					continue
				}
				if !reaches(g.Host, l.host) {
					t.Errorf("container %s: %s probe to host %q cannot reach %s listening on %q", c.Name, kind, g.Host, l.container, l.host)
				}
				bound := healthzBound
				if l.container == registrarContainer {
					bound = registrarHealthzBound
				}
				if l.container == livenessContainer {
					v := flagsOf(t, in.container(t, livenessContainer))["probe-timeout"]
					if v == "" {
						v = "1s" // livenessprobe's default
					}
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Fatalf("livenessprobe --probe-timeout=%s: %v", v, err)
					}
					bound = d
				}
				if time.Duration(p.TimeoutSeconds)*time.Second <= bound {
					t.Errorf("container %s: %s probe times out after %ds, but %s answers within %s", c.Name, kind, p.TimeoutSeconds, l.container, bound)
				}
			}
		}
		if port := in.probePort(t, pm, pm.LivenessProbe.HTTPGet.Port); !containsListener(ls, livenessContainer, port) {
			t.Errorf("liveness probe on port %d, not livenessprobe's: kubelet must not restart pathmend on a slow monitor tick", port)
		}
		if port := in.probePort(t, pm, pm.ReadinessProbe.HTTPGet.Port); !containsListener(ls, pluginContainer, port) {
			t.Errorf("readiness probe on port %d, not pathmend's /healthz", port)
		}
	})
}

// probePort resolves a probe's port: a name is looked up in the probed
// container's own ports, as kubelet does; a number is taken as is.
func (in install) probePort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s: probe port %q is not one of its named ports", c.Name, p.StrVal)
	return 0
}

// reaches reports whether a probe to probeHost ("" is the pod IP, which is
// the node's address on the host network) reaches a listener bound to
// bindHost. A listener bound to "<status.hostIP>" (the flag names an
// environment variable set from it) is on that same address.
func reaches(probeHost, bindHost string) bool {
	switch bindHost {
	case "", "0.0.0.0", "::":
		return true
	case "<status.hostIP>":
		return probeHost == ""
	}
	return probeHost == bindHost
}
