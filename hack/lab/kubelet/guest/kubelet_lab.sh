#!/bin/bash
# The job of `make kubelet-lab` in the guest: kubelab brings the one-node
# cluster up, runs the scenario and prints the timed report; its exit
# status is the job's. Every daemon's log lands in /lab/out/.
set -uo pipefail
LAB=${LAB:-/lab}
export LAB_BIN=$LAB/bin
echo "kubelet lab: guest $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%d MiB", $2 / 1024 }' /proc/meminfo), up $(cut -d' ' -f1 /proc/uptime)s"
exec "$LAB_BIN/kubelab" -lab "$LAB"
