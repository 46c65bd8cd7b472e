# shellcheck shell=bash
# pathmend lab: the NVMe heal section of the walk-through. lab.sh sources
# this file and calls lab_nvme_heal after its own part; it needs lab.sh's
# step, targets.sh and fixtures.sh (NQN_PREFIX).
#
# Two "arrays" share one subsystem NQN: array A is nvmet subsystem $nqn
# on 127.0.0.1:4420 (controller IDs 1-99); array B is a second nvmet
# subsystem (IDs 100-199) that nqnproxy presents under the same NQN on
# 127.0.0.3:4420. B's namespace 1 is backed by A's device (a replica) and
# starts with A's UUID, so the volume has two paths. The section attaches
# the volume through pathmend's CSI socket (csistage), shows it healthy,
# then gives B's namespace another UUID: Linux refuses the namespace on
# B's controller ("IDs don't match for shared namespace"), which stays
# live and contributes no path (ControllerNotContributing). It shows
# `pathmend diagnose --plan`, the monitor's verdict lines as it repairs,
# defers on its cooldown and then on its grace (the cooldown is shorter
# than the grace here, so the repair's own young controller shows the
# grace at work), the state after, and fixes the array. Last, B's path
# stays away past ctrl_loss_tmo: the kernel deletes its controller and the
# monitor reconnects the endpoint once it answers again.

# lab_nvme_verdicts LOG prints pathmend's heal decisions and reconnects,
# without klog's header.
lab_nvme_verdicts() {
	grep -E '"(Heal verdict|Reconnected path|Path not reconnected|Volume not usable after connect; trying one repair)"' "$1" |
		sed -E 's/^[IWEF][0-9]{4} ([0-9:.]+) +[0-9]+ [^]]+\] /\1 /' || echo "(none yet)"
}

lab_nvme_diagnose() {
	local rc=0
	"$LAB_BIN/pathmend" diagnose --sys-root /sys --state-dir "$1" "${@:2}" || rc=$?
	echo "(pathmend diagnose exit status $rc)"
}

# lab_nvme_block NQN prints, from diagnose's table output, the lines
# from the subsystem line of NQN to the next blank line, and the status.
lab_nvme_block() {
	awk -v n="$1" 'index($0, n) && /^nvme-subsys/ { p = 1 } p && /^$/ { p = 0 } p || /^\(pathmend diagnose/'
}

lab_nvme_legs() {
	local sub
	sub=$(subsys_of_ctrl "$1") || return 1
	ls -d /sys/class/nvme/nvme*/"${sub/nvme-subsys/nvme}"c*n1 2>/dev/null | wc -l
}
lab_nvme_legs_are() { [ "$(lab_nvme_legs "$1")" -eq "$2" ]; }

# lab_nvme_refusals CTRL counts the kernel's "IDs don't match for shared
# namespace" messages about CTRL.
lab_nvme_refusals() { dmesg | grep -cF "$1: IDs don't match for shared namespace" || true; }
lab_nvme_refused_more() { [ "$(lab_nvme_refusals "$1")" -gt "$2" ]; }

# lab_nvme_ctrl_to NQN ADDR SVC prints the live controller of NQN to
# ADDR:SVC. The address of a controller that is not live is never read:
# on Debian's 6.1 kernel that read can oops nvme-tcp (nvme_tcp_get_address)
# and leave the controller resetting for good.
lab_nvme_ctrl_to() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] || continue
		[ "$(cat "$c/state" 2>/dev/null)" = live ] || continue
		case $(cat "$c/address" 2>/dev/null) in
		"traddr=$2,trsvcid=$3"*) basename "$c" && return 0 ;;
		esac
	done
	return 1
}

lab_nvme_heal() {
	local nqn=$NQN_PREFIX:heal alias=$NQN_PREFIX:heal-b dir=/run/pathmend/heal
	local log=$LAB/out/pathmend-heal.log dev ua ub ca cb vctx
	local grace=10s cooldown=5s t0 refused cb2 nrec
	ua=$(lab_uuid_of "$nqn/1")
	ub=$(lab_uuid_of "$alias/1")

	step "NVMe heal: two arrays answer $nqn: A on 127.0.0.1:4420 (cntlids 1-99), B via nqnproxy on 127.0.0.3:4420 (cntlids 100-199), B's namespace a replica of A's"
	if [ ! -d "$NVMET/ports/1" ]; then
		nvmet_port_create 1 127.0.0.1 4420
		nvmet_port_ana 1 1 optimized
	fi
	nvmet_subsys_create "$nqn" 1 99
	nvmet_subsys_create "$alias" 100 199
	dev=$(lab_loop_create heal-array 64)
	nvmet_ns_add "$nqn" 1 "$dev" 1 "$ua"
	nvmet_ns_add "$alias" 1 "$dev" 1 "$ua"
	nvmet_port_link 1 "$nqn"
	nvmet_port_link 1 "$alias"
	nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 "$nqn" "$alias"

	step "Starting pathmend serve (heal=repair, monitor 1s, heal grace $grace, cooldown $cooldown) on unix://$dir/csi.sock"
	mkdir -p "$dir/state"
	"$LAB_BIN/pathmend" serve --endpoint "unix://$dir/csi.sock" --node-id pathmend-lab \
		--sys-root /sys --dev-root /dev --state-dir "$dir/state" --kubelet-root "$dir" --heal=repair -v=4 \
		--monitor-interval=1s --heal-grace="$grace" --heal-cooldown="$cooldown" >"$log" 2>&1 &
	PM=$! # lab.sh's exit trap stops it
	"$LAB_BIN/csiprobe" -endpoint "unix://$dir/csi.sock" -wait 30s >/dev/null

	step "NodeStageVolume through the CSI socket: vol-heal, nsid 1, endpoints 127.0.0.1:4420 (optimized) and 127.0.0.3:4420"
	vctx="transport=nvme-tcp,nqn=$nqn,nsid=1,endpoints=127.0.0.1:4420;127.0.0.3:4420,optimizedEndpoints=127.0.0.1:4420"
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" stage -volume-id vol-heal -staging "$dir/staging" -context "$vctx"
	ca=$(lab_nvme_ctrl_to "$nqn" 127.0.0.1 4420)
	lab_wait 20 "two legs of namespace 1" lab_nvme_legs_are "$ca" 2
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal
	head -c 1M /dev/urandom >"$dir/pattern"
	cp "$dir/pattern" "$dir/staging/pattern"
	sync
	step "pathmend diagnose: the volume's subsystem healthy, two paths"
	lab_nvme_diagnose "$dir/state" | lab_nvme_block "$nqn"

	step "Forcing ControllerNotContributing: array B's namespace 1 gets another UUID (disable, device_uuid, enable)"
	cb=$(lab_nvme_ctrl_to "$nqn" 127.0.0.3 4420)
	refused=$(lab_nvme_refusals "$cb")
	t0=$(cut -d' ' -f1 /proc/uptime)
	nvmet_ns_disable "$alias" 1
	echo "$ub" >"$NVMET/subsystems/$alias/namespaces/1/device_uuid"
	nvmet_ns_enable "$alias" 1
	lab_wait 10 "array B's leg to go" lab_nvme_legs_are "$ca" 1
	lab_wait 10 "the kernel to refuse B's namespace on $cb" lab_nvme_refused_more "$cb" "$refused"
	lab_log "kernel: $(dmesg | grep -F "$cb: IDs don't match" | tail -1)"
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal || true

	step "pathmend diagnose --plan (the policy's dry run, grace $grace)"
	lab_nvme_diagnose "$dir/state" --plan --heal-grace "$grace" | sed -n '/defect(s):/,$p'

	step "The monitor's decisions in pathmend's log (fault at ${t0}s guest uptime)"
	lab_wait 40 "the monitor's repair" grep -q 'verdict="repaired"' "$log"
	lab_wait 15 "the cooldown deferral after it" grep -q 'reason="cooldown:' "$log"
	lab_wait 20 "the grace deferral of the repair's new controller" sh -c "sed -n '/reason=\"cooldown:/,\$p' '$log' | grep -q 'reason=\"grace:'"
	lab_nvme_verdicts "$log"
	echo "(a grace deferral before the repair, when there is one, is the fault's own doing: re-enabling B's namespace can leave"
	echo " its controller younger than --heal-grace ($grace), and a controller that young may still be attaching its namespace. The repair tore B's controller"
	echo " down and the same tick reconnected 127.0.0.3:4420; the new controller is refused the namespace too, so the defect is back"
	echo " at once: deferred by the cooldown ($cooldown: the key was just repaired), then by the grace (the new controller is younger"
	echo " than $grace); once both have passed it is repaired again. An unchanged deferral is logged once per key.)"
	step "The state after: the mismatch persists on the array; the monitor repairs it at most once per cooldown + grace (diagnose --plan starts a fresh policy: it knows no cooldown)"
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal || true
	lab_nvme_diagnose "$dir/state" --plan --heal-grace "$grace" | sed -n '/defect(s):/,$p'

	step "Fixing array B: its namespace 1 takes A's UUID again"
	nvmet_ns_disable "$alias" 1
	echo "$ua" >"$NVMET/subsystems/$alias/namespaces/1/device_uuid"
	nvmet_ns_enable "$alias" 1
	lab_wait 15 "both legs back" lab_nvme_legs_are "$ca" 2
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal
	lab_nvme_diagnose "$dir/state" | lab_nvme_block "$nqn"
	echo round-robin >"/sys/class/nvme-subsystem/$(subsys_of_ctrl "$ca")/iopolicy"
	echo 3 >/proc/sys/vm/drop_caches
	if cmp -s "$dir/pattern" "$dir/staging/pattern"; then
		echo "the 1 MiB pattern written before the fault reads back identical (round-robin over both paths, cold cache)"
	else
		lab_fail "the pattern written before the fault does not read back identical"
	fi
	step "Past ctrl_loss_tmo: array B's path goes away (nqnproxy stopped) and stays away until the kernel deletes its controller"
	cb2=$(lab_nvme_ctrl_to "$nqn" 127.0.0.3 4420)
	# The kernel's defaults are reconnect_delay 10 s and ctrl_loss_tmo
	# 600 s; shortened on this one controller so the section takes seconds.
	echo 1 >"/sys/class/nvme/$cb2/reconnect_delay"
	echo 3 >"/sys/class/nvme/$cb2/ctrl_loss_tmo"
	nrec=$(grep -c '"Reconnected path"' "$log" || true)
	nqnproxy_stop_all
	lab_wait 20 "$cb2 to leave live" sh -c "[ \"\$(cat /sys/class/nvme/$cb2/state 2>/dev/null)\" != live ]"
	lab_log "$cb2 $(cat "/sys/class/nvme/$cb2/state" 2>/dev/null || echo gone) (reconnect_delay 1 s, ctrl_loss_tmo 3 s for this demo)"
	lab_wait 30 "the kernel to delete $cb2" sh -c "[ ! -e /sys/class/nvme/$cb2 ]"
	lab_wait 30 "the monitor's reconnect attempt" grep -q '"Path not reconnected".*127.0.0.3:4420' "$log"
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal || true
	echo "(the controller is gone, not reconnecting: the kernel gave up. The volume's record still lists 127.0.0.3:4420, so every tick the"
	echo " monitor probes it and reconnects it once it answers, backing off per endpoint meanwhile; no other volume waits for it)"
	step "Array B's path answers again (nqnproxy restarted): the monitor reconnects it when its backoff ends"
	nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 "$nqn" "$alias"
	lab_wait 60 "the monitor to reconnect 127.0.0.3:4420" sh -c "[ \"\$(grep -c '\"Reconnected path\"' $log)\" -gt $nrec ]"
	lab_wait 15 "both legs back" lab_nvme_legs_are "$ca" 2
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" health -volume-id vol-heal

	step "pathmend's heal decisions over the whole section"
	lab_nvme_verdicts "$log"

	step "NodeUnstageVolume; stopping pathmend (its log: out/pathmend-heal.log)"
	"$LAB_BIN/csistage" -endpoint "unix://$dir/csi.sock" unstage -volume-id vol-heal -staging "$dir/staging"
	kill -TERM "$PM"
	wait "$PM" || true
	PM=
}
