package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The lab node. The guest has only a loopback interface: the node's
// address is an extra address on lo, because kubelet refuses a loopback
// node IP and kube-apiserver needs an address to advertise.
const (
	nodeName   = "pathmend-lab"
	nodeIP     = "10.20.0.1"
	serviceNet = "10.96.0.0/24"
	serviceIP  = "10.96.0.1"
	apiPort    = 6443
	driverName = "csi.pathmend.io"
	kubeletDir = "/var/lib/kubelet"
	// csiSocket is where the DaemonSet's hostPath puts pathmend's socket.
	csiSocket   = kubeletDir + "/plugins/" + driverName + "/csi.sock"
	registryDir = kubeletDir + "/plugins_registry"
	containerd  = "/run/containerd/containerd.sock"
	// Images built on the host (run.sh) from Debian's busybox-static and
	// hack/lab/kubelet/pause, imported into containerd; nothing is pulled.
	workloadImage = "localhost/pathmend-lab/busybox:1"
	pauseImage    = "localhost/pathmend-lab/pause:1"
)

// nodeModules are the kernel modules docs/install.md has every node load
// at boot: pathmend loads none itself.
var nodeModules = []string{"nvme-tcp", "iscsi_tcp", "dm_multipath"}

// prepareNode makes the guest a node kubelet, containerd and pathmend
// accept: the kernel modules of docs/install.md, cgroup v2 mounted with
// the controllers kubelet needs delegated to its children, the node
// address on lo, and the directories they expect.
func prepareNode() error {
	for _, m := range nodeModules {
		if out, err := command("modprobe", m); err != nil {
			return fmt.Errorf("modprobe %s: %v: %s", m, err, out)
		}
	}
	var st syscall.Statfs_t
	if err := os.MkdirAll("/sys/fs/cgroup", 0o755); err != nil {
		return err
	}
	if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil {
		return err
	}
	const cgroup2Magic = 0x63677270
	if st.Type != cgroup2Magic {
		if err := syscall.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
			return fmt.Errorf("mount cgroup2: %w", err)
		}
	}
	ctrls, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return err
	}
	// One write per controller: the kernel stops at the first it refuses.
	// kubelet needs cpu, cpuset, memory and pids; the others are optional.
	for _, c := range strings.Fields(string(ctrls)) {
		err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+"+c), 0o644)
		switch c {
		case "cpu", "cpuset", "memory", "pids":
			if err != nil {
				return fmt.Errorf("delegate cgroup controller %s: %w", c, err)
			}
		}
	}
	if !hasAddress(nodeIP) {
		if out, err := command("ip", "addr", "add", nodeIP+"/32", "dev", "lo"); err != nil {
			return fmt.Errorf("ip addr add %s: %v: %s", nodeIP, err, out)
		}
	}
	for _, d := range []string{kubeletDir, registryDir, filepath.Dir(csiSocket), "/etc/containerd", "/var/log/pods", "/etc/kubernetes"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// kubelet reads the host's resolver configuration even for host-network
	// pods; the guest has none.
	if _, err := os.Stat("/etc/resolv.conf"); err != nil {
		if err := os.WriteFile("/etc/resolv.conf", []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func hasAddress(ip string) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.String() == ip {
			return true
		}
	}
	return false
}

// containerdConfig is containerd's configuration for the lab:
//   - the native snapshotter: the guest kernel has no overlay module, and
//     the root filesystem is the initramfs;
//   - runc without pivot_root, which the initramfs root does not allow;
//   - cgroupfs (no systemd in the guest), no AppArmor profile (none is
//     loaded), the locally built pause image as the sandbox image.
const containerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "` + containerd + `"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + pauseImage + `"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        NoPivotRoot = true
        SystemdCgroup = false
`

// kubeletConfig is kubelet's configuration file. Volume health is probed
// every volumeStatsAggPeriod (the volume health manager's interval), so
// the lab sets it to 5 s instead of a minute. Authentication and
// authorization of kubelet's own API are off: nothing calls it here.
// Eviction thresholds are near zero: the guest's disk is RAM.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
featureGates:
  CSIVolumeHealth: true
volumeStatsAggPeriod: 5s
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://` + containerd + `
failSwapOn: false
localStorageCapacityIsolation: false
resolvConf: /etc/resolv.conf
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`
