#!/bin/bash
# pathmend lab: the walk-through `make lab` runs in the guest. It builds an
# NVMe-oF/TCP target (two namespaces, two ports with ANA optimized and
# non-optimized) and an iSCSI target (two portals, dm-multipath), connects
# the host side, shows the node's topology as read from sysfs (the capture
# tool's summary and `pathmend diagnose --plan`), starts pathmend and talks
# CSI to it over its socket, then breaks one path of each transport and
# shows what the kernel publishes and what pathmend makes of it.
set -euo pipefail
LAB=${LAB:-/lab}
export LAB_BIN=$LAB/bin
# shellcheck source=targets.sh
. "$LAB/guest/targets.sh"
# shellcheck source=fixtures.sh
. "$LAB/guest/fixtures.sh"

step() { printf '\n==> [guest %6ss] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*"; }
# diagnose exits non-zero when it finds defects: that is its report, not
# a failure of the walk-through.
diagnose() {
	local rc=0
	"$LAB_BIN/pathmend" diagnose --sys-root /sys --state-dir /run/pathmend/state --plan || rc=$?
	echo "(pathmend diagnose exit status $rc)"
}

trap 'lab_teardown_all; [ -n "${PM:-}" ] && kill "$PM" 2>/dev/null; true' EXIT

step "Building NVMe-oF/TCP targets: $NQN_PREFIX:lab with 2 namespaces on 127.0.0.1:4420 (optimized) and :4421 (non-optimized)"
nvme_two_port_target "$NQN_PREFIX:lab" 2
step "Connecting the host through /dev/nvme-fabrics (both ports)"
ctrls=$(nvme_connect_both "$NQN_PREFIX:lab")
lab_wait 20 "two legs per namespace" legs_ready "$(subsys_of_ctrl "${ctrls%% *}")" 2
echo "controllers: $ctrls"

step "Building a LIO iSCSI target: $IQN_PREFIX:lab with 1 LUN on portals 127.0.0.1:3260 and 127.0.0.2:3260"
iscsi_target "$IQN_PREFIX:lab" 1
step "Starting iscsid and multipathd, logging in through both portals"
multipathd_start
iscsi_login_both "$IQN_PREFIX:lab"
lab_wait 30 "the multipath map" dm_maps_ready 1

step "The node's storage topology, as read from sysfs"
"$LAB_BIN/capture-sysfs" -summary
mkdir -p /run/pathmend/state

step "pathmend diagnose --plan: what pathmend reads from sysfs and would do (a dry run)"
diagnose

step "Starting pathmend serve (heal=observe) on unix:///run/pathmend/csi.sock"
"$LAB_BIN/pathmend" serve --endpoint unix:///run/pathmend/csi.sock --node-id pathmend-lab \
	--sys-root /sys --dev-root /dev --state-dir /run/pathmend/state --heal=observe -v=4 \
	>"$LAB/out/pathmend.log" 2>&1 &
PM=$!
step "Talking CSI to pathmend over its socket"
"$LAB_BIN/csiprobe" -endpoint unix:///run/pathmend/csi.sock -wait 30s

step "Breaking one path of each transport: unlinking NVMe port 2, dropping packets to 127.0.0.2:3260"
nvmet_port_unlink 2 "$NQN_PREFIX:lab"
fault_drop_port 3260 127.0.0.2
c2=${ctrls##* }
nvme_wait_state "$c2" connecting 30
s=$(iscsi_session_of "$IQN_PREFIX:lab" 127.0.0.2:3260)
iscsi_wait_state "$s" FAILED 90 || true
"$LAB_BIN/capture-sysfs" -summary
step "pathmend diagnose --plan with the broken paths"
diagnose
echo "NVMe: $c2 is $(cat "/sys/class/nvme/$c2/state"): the kernel retries it every $(cat "/sys/class/nvme/$c2/reconnect_delay") s for up to ctrl_loss_tmo ($(cat "/sys/class/nvme/$c2/ctrl_loss_tmo") s)."
echo "      A reconnecting controller is not a defect: the plan above has no NVMe entry, pathmend decides nothing and leaves it to the kernel."
echo "      Past ctrl_loss_tmo the kernel deletes the controller; for a staged volume the monitor then reconnects the endpoint itself once it answers"
echo "      (the NVMe heal section below shows it). iSCSI: the session is $(cat "/sys/class/iscsi_session/$s/state"); iscsid reopens it by itself, and the session"
echo "      heal acts only on a session of a staged volume (hence 'out of scope' above) down longer than --iscsi-stuck-threshold (45 s)"
echo "      with its portal reachable the whole time (the iSCSI heal section)."

step "Restoring both paths"
nvmet_port_link 2 "$NQN_PREFIX:lab"
fault_restore_port 3260 127.0.0.2
nvme_wait_state "$c2" live 30
iscsi_wait_state "$s" LOGGED_IN 90
"$LAB_BIN/capture-sysfs" -summary

step "Stopping pathmend; its log (last 15 lines):"
kill -TERM "$PM"
wait "$PM" || true
PM=
tail -n 15 "$LAB/out/pathmend.log"
. "$LAB/guest/lab_nvme.sh"; lab_nvme_heal # NVMe heal section: ControllerNotContributing, defer, repair, fix
bash "$LAB/guest/lab_iscsi.sh" # iSCSI heal section: a stuck session, pathmend serve kicks it (fails the lab if the kick does not bring it back)
step "Tearing the targets down"
