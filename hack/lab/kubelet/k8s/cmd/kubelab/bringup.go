package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Flags of `pathmend serve` under kubelet: the DaemonSet's, with the
// lab's paths (no container: sysfs, /dev and the state directory are the
// guest's own), heal=repair, the monitor's default interval and the
// default iSCSI stuck threshold, iscsid restarted by the lab's script
// (no systemd), and a JSON log at -v=5 so every request kubelet sends is
// on record with its paths (secrets stripped).
func (l *Lab) pathmendArgs() []string {
	return []string{
		filepath.Join(l.bin, "pathmend"), "serve",
		"--endpoint=unix://" + csiSocket,
		"--node-id=" + nodeName,
		"--heal=repair",
		"--state-dir=/var/lib/pathmend",
		"--sys-root=/sys",
		"--dev-root=/dev",
		"--hostnqn-file=/etc/nvme/hostnqn",
		"--hostid-file=/etc/nvme/hostid",
		"--metrics-address=[" + nodeIP + "]:9811",
		"--kubelet-root=" + kubeletDir,
		"--shutdown-timeout=30s",
		"--iscsid-restart-command=bash /run/lab/restart-iscsid.sh",
		"--logging-format=json",
		"-v=5",
	}
}

// kubeletArgs: the configuration file carries everything but the node's
// identity.
func (l *Lab) kubeletArgs() []string {
	return []string{
		filepath.Join(l.bin, "kubelet"),
		"--config=/etc/kubernetes/kubelet.yaml",
		"--kubeconfig=/etc/kubernetes/kubelet.kubeconfig",
		"--hostname-override=" + nodeName,
		"--node-ip=" + nodeIP,
		"--root-dir=" + kubeletDir,
		"--v=2",
	}
}

// startLimit is the safety net of each bring-up wait for a daemon the lab
// just started (etcd, kube-apiserver, containerd, pathmend, kubelet) to
// answer; each wait ends as soon as its event is seen, or as soon as one
// of the daemons exits (waitFor watches them all). A start under TCG is
// CPU-bound and slows with the host's load. Idle, the slowest seen were
// kube-apiserver's /readyz 126 s and kubelet's Node and CSINode 88 s.
// Beside two CPU burners on the host (make e2e-under-load) etcd took
// 12.6 s (2.1 s idle), kube-apiserver 394 s (31 s idle), and kubelet
// logged its first line 3 min 38 s after it was started and asked to
// register its Node 5 min 8 s after: 8 s past the 5 minutes the Node wait
// had then, and the run failed with kubelet about to register. 20
// minutes is 3x the slowest start seen under load and 9x the slowest
// idle. (kube-apiserver's "Too large resource version" lines are its
// object-count estimator asking the watch cache of a resource without
// events, which etcd 3.4's progress notifications never advance; they
// appear in every run, idle and passing too, and are not the cause.)
const startLimit = 20 * time.Minute

// bringUp starts the node: etcd, kube-apiserver, containerd (with the
// lab's images), pathmend and its registrar, kubelet.
func (l *Lab) bringUp() error {
	if err := l.step("node: cgroup v2, node address, PKI, configuration files", l.node); err != nil {
		return err
	}
	if err := l.step("etcd serving", l.etcd); err != nil {
		return err
	}
	if err := l.step("kube-apiserver ready (/readyz)", l.apiserver); err != nil {
		return err
	}
	if err := l.step("containerd serving, images imported", l.containerd); err != nil {
		return err
	}
	if err := l.step("pathmend serve and its registrar", l.pathmend); err != nil {
		return err
	}
	return l.step("kubelet: node registered, pathmend registered (CSINode)", l.kubelet)
}

func (l *Lab) node() error {
	if err := prepareNode(); err != nil {
		return err
	}
	ip := net.ParseIP(nodeIP)
	pki, err := newPKI(filepath.Join(l.run, "pki"), []net.IP{ip, net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)})
	if err != nil {
		return err
	}
	l.pki = pki
	server := fmt.Sprintf("https://%s", net.JoinHostPort(nodeIP, fmt.Sprint(apiPort)))
	files := map[string][]byte{
		"/etc/containerd/config.toml":            []byte(containerdConfig),
		"/etc/kubernetes/kubelet.yaml":           []byte(kubeletConfig),
		"/etc/kubernetes/kubelet.kubeconfig":     pki.Kubeconfig(server, "system:node:"+nodeName, pki.KubeletToken),
		filepath.Join(l.out, "admin.kubeconfig"): pki.Kubeconfig(server, "lab-admin", pki.AdminToken),
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	l.cs, err = l.client()
	return err
}

func (l *Lab) etcd() error {
	if err := l.start("etcd", "/usr/bin/etcd",
		"--name=lab", "--data-dir="+filepath.Join(l.run, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=lab=http://127.0.0.1:2380", "--logger=zap", "--log-level=warn"); err != nil {
		return err
	}
	return l.wait(startLimit, "etcd /health", func() (bool, error) {
		resp, err := http.Get("http://127.0.0.1:2379/health")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// apiserver: tokens for the two clients, Node and RBAC authorization
// with NodeRestriction (kubelet sees only what its pods need, such as the
// iSCSI volume's node-stage secret), the CSIVolumeHealth gate so pod
// status and CSINode keep the health fields, no endpoint reconciler and
// no priority and fairness (one client, less CPU under TCG).
func (l *Lab) apiserver() error {
	p := l.pki
	if err := l.start("kube-apiserver", filepath.Join(l.bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--advertise-address="+nodeIP,
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+p.Path(apiserverCrtFile),
		"--tls-private-key-file="+p.Path(apiserverKeyFile),
		"--token-auth-file="+p.Path(tokensFile),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p.Path(saPubFile),
		"--service-account-signing-key-file="+p.Path(saKeyFile),
		"--service-cluster-ip-range="+serviceNet,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--feature-gates=CSIVolumeHealth=true",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--cert-dir="+filepath.Join(l.run, "apiserver"),
		"--v=1"); err != nil {
		return err
	}
	var last string
	err := l.wait(startLimit, "kube-apiserver /readyz", func() (bool, error) {
		ctx, cancel := l.ctx()
		defer cancel()
		b, err := l.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			last = strings.TrimSpace(string(b))
			return false, err
		}
		return strings.TrimSpace(string(b)) == "ok", nil
	})
	if err != nil && last != "" {
		return fmt.Errorf("%w; /readyz said: %s", err, last)
	}
	return err
}

// containerd, then the images run.sh built imported into its k8s.io
// namespace with the native snapshotter CRI uses.
func (l *Lab) containerd() error {
	if err := l.start("containerd", "/usr/bin/containerd", "--config=/etc/containerd/config.toml"); err != nil {
		return err
	}
	if err := l.wait(startLimit, "containerd's socket", func() (bool, error) {
		_, err := command("ctr", "--address", containerd, "version")
		return err == nil, err
	}); err != nil {
		return err
	}
	for _, img := range []string{"pause.tar", "busybox.tar"} {
		out, err := commandEnv([]string{"CONTAINERD_SNAPSHOTTER=native"}, "ctr", "--address", containerd, "-n", "k8s.io",
			"images", "import", filepath.Join(l.bin, img))
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", img, err, out)
		}
	}
	out, err := command("ctr", "--address", containerd, "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, want := range []string{workloadImage, pauseImage} {
		l.check(strings.Contains(out, want), "image %s not in containerd after the import: %s", want, out)
	}
	return nil
}

// pathmend serve on the DaemonSet's socket path, then the registrar that
// stands in for node-driver-registrar.
func (l *Lab) pathmend() error {
	if err := os.MkdirAll("/var/lib/pathmend", 0o700); err != nil {
		return err
	}
	if err := l.start("pathmend", l.pathmendArgs()...); err != nil {
		return err
	}
	err := l.wait(startLimit, "pathmend's socket", func() (bool, error) {
		_, err := os.Stat(csiSocket)
		return err == nil, err
	})
	if err != nil {
		return err
	}
	// Supervised like the DaemonSet's registrar container.
	l.registrar, err = supervise("labregistrar", filepath.Join(l.out, "labregistrar.log"), 2*time.Second,
		filepath.Join(l.bin, "labregistrar"),
		"-csi-address="+csiSocket, "-kubelet-registration-path="+csiSocket, "-plugin-registration-path="+registryDir)
	return err
}

func (l *Lab) kubelet() error {
	t0 := time.Now()
	if err := l.start("kubelet", l.kubeletArgs()...); err != nil {
		return err
	}
	err := l.wait(startLimit, "Node "+nodeName, func() (bool, error) {
		ctx, cancel := l.ctx()
		defer cancel()
		_, err := l.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	})
	l.note("%s", kubeletProgress(filepath.Join(l.out, "kubelet.log"), t0))
	if err != nil {
		return err
	}
	err = l.wait(startLimit, "pathmend in CSINode "+nodeName, l.driverRegistered)
	l.note("registrar restarted %d times before kubelet accepted the registration", l.registrar.Restarts())
	if n := l.registrar.Restarts(); n > 0 {
		l.retried("the registrar was restarted %d times (kubelet refused a registration, as it restarts a DaemonSet's registrar container)", n)
	}
	return err
}

// driverRegistered: kubelet called NodeGetInfo and recorded the driver.
func (l *Lab) driverRegistered() (bool, error) {
	ctx, cancel := l.ctx()
	defer cancel()
	n, err := l.cs.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	for _, d := range n.Spec.Drivers {
		if d.Name == driverName && d.NodeID == nodeName {
			return true, nil
		}
	}
	return false, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// kubeletProgress says how far the kubelet started at t0 got, from its
// log (the part after kubelab's last "starting kubelet" line): when it
// logged its first line and when it asked to register its Node. A slow
// guest shows here as a late first line.
func kubeletProgress(path string, t0 time.Time) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("kubelet's log: %v", err)
	}
	text := string(b)
	if i := strings.LastIndex(text, "==== kubelab: starting kubelet"); i >= 0 {
		text = text[i:]
	}
	var first, register time.Time
	for _, line := range strings.Split(text, "\n") {
		at, ok := klogTime(line, t0)
		if !ok {
			continue
		}
		if first.IsZero() {
			first = at
		}
		if strings.Contains(line, "Attempting to register node") {
			register = at
			break
		}
	}
	since := func(t time.Time) string {
		if t.IsZero() {
			return "not yet"
		}
		return fmt.Sprintf("%.1fs after its start", t.Sub(t0).Seconds())
	}
	return fmt.Sprintf("kubelet logged its first line %s and asked to register its Node %s", since(first), since(register))
}

// klogTime reads the time of a klog text line ("I1204 19:48:18.376958 ..."),
// in the year of ref (klog's header has none).
func klogTime(line string, ref time.Time) (time.Time, bool) {
	if len(line) < 22 || !strings.ContainsRune("IWEF", rune(line[0])) {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return t.AddDate(ref.Year(), 0, 0), true
}
