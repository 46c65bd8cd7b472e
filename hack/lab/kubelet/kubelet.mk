# pathmend under a real kubelet (hack/lab/kubelet/README.md). Included by
# the top-level Makefile. Needs root; hold the lab lock:
#   flock /tmp/pathmend-lab.lock make kubelet-lab

.PHONY: kubelet-lab kubelet-lab-shell

kubelet-lab: ## pods on NVMe-oF and iSCSI PVCs under a real kubelet in the lab guest, through faults
	hack/lab/kubelet/run.sh

kubelet-lab-shell: ## the kubelet lab's guest with an interactive shell (nothing started)
	hack/lab/kubelet/run.sh shell
