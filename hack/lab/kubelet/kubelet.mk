# pathmend under a real kubelet (hack/lab/kubelet/README.md). Included by
# the top-level Makefile. Needs root; hold the lab lock:
#   flock /tmp/pathmend-lab.lock make kubelet-lab

.PHONY: kubelet-lab kubelet-lab-build kubelet-lab-shell

kubelet-lab-build: ## build (or reuse) the kubelet lab's Kubernetes binaries and guest image without running it (.ci/run starts it early)
	hack/lab/kubelet/build.sh >/dev/null
	hack/lab/kubelet/image.sh >/dev/null

kubelet-lab: ## pods on NVMe-oF and iSCSI PVCs under a real kubelet in the lab guest, through faults
	hack/lab/kubelet/run.sh

kubelet-lab-shell: ## the kubelet lab's guest with an interactive shell (nothing started)
	hack/lab/kubelet/run.sh shell
