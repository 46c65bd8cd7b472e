#!/bin/bash
# pathmend lab: fixture scenarios. Run in the guest as
#
#   bash /lab/guest/fixtures.sh NAME
#
# Each scenario builds real targets, drives the host side into the state it
# is named for, waits until sysfs shows that state, captures the tree with
# capture-sysfs into /lab/out/fixtures/NAME.sysfs (with a header saying the
# scenario and what to expect) and tears everything down. `make fixtures`
# runs every scenario, each in a fresh guest. Sourcing it (lab-shell does)
# defines the fixture_* functions without running anything.
LAB=${LAB:-/lab}
LAB_BIN=${LAB_BIN:-$LAB/bin}
# shellcheck source=targets.sh
. "$LAB/guest/targets.sh"

OUT=$LAB/out/fixtures
NQN_PREFIX=nqn.2024-01.io.pathmend.lab
IQN_PREFIX=iqn.2024-01.io.pathmend.lab
# Reconnect quickly and never give a lost controller up during a capture.
CONNECT_OPTS=reconnect_delay=2,ctrl_loss_tmo=600

# capture NAME SCENARIO EXPECT [NOTE...] writes the fixture and prints the
# summary of what was captured.
capture() {
	local name=$1 scenario=$2 expect=$3 args=()
	shift 3
	mkdir -p "$OUT"
	args=(-comment "fixture: $name" -comment "scenario: $scenario" -comment "expect: $expect")
	for n in "$@"; do args+=(-comment "note: $n"); done
	args+=(-comment "captured in the pathmend lab (make fixtures); never edit by hand")
	# uname -r names the ABI; /proc/version carries the Debian package version.
	args+=(-kernel "$(uname -r) (Debian $(awk '{ for (i = 1; i < NF; i++) if ($i == "Debian") v = $(i + 1) } END { print v }' /proc/version))")
	"$LAB_BIN/capture-sysfs" -o "$OUT/$name.sysfs" "${args[@]}"
	lab_log "captured $name: $(wc -l <"$OUT/$name.sysfs") lines"
	"$LAB_BIN/capture-sysfs" -summary -fixture "$OUT/$name.sysfs"
}

# nvme_ports creates ports 1 (127.0.0.1:4420, ANA group 1 optimized) and
# 2 (127.0.0.1:4421, non-optimized) once.
nvme_ports() {
	[ -d "$NVMET/ports/1" ] && return 0
	nvmet_port_create 1 127.0.0.1 4420
	nvmet_port_create 2 127.0.0.1 4421
	nvmet_port_ana 1 1 optimized
	nvmet_port_ana 2 1 non-optimized
}

# nvme_two_port_target NQN NS_COUNT builds a subsystem with NS_COUNT
# namespaces on loop devices, linked to both ports.
nvme_two_port_target() {
	local nqn=$1 count=$2 i dev tag
	nvme_ports
	nvmet_subsys_create "$nqn"
	tag=${nqn##*:}
	for ((i = 1; i <= count; i++)); do
		dev=$(lab_loop_create "$tag-ns$i" 64)
		nvmet_ns_add "$nqn" "$i" "$dev" 1 "$(lab_uuid_of "$nqn/$i")"
	done
	nvmet_port_link 1 "$nqn"
	nvmet_port_link 2 "$nqn"
}

# nvme_connect_both NQN connects over both ports and waits until both
# controllers are live; prints the two controller names.
nvme_connect_both() {
	local nqn=$1 c1 c2
	c1=$(nvme_host_connect "$nqn" 127.0.0.1 4420 "$CONNECT_OPTS")
	c2=$(nvme_host_connect "$nqn" 127.0.0.1 4421 "$CONNECT_OPTS")
	nvme_wait_state "$c1" live
	nvme_wait_state "$c2" live
	echo "$c1 $c2"
}

head_count() { ls -d /sys/class/nvme-subsystem/"$1"/nvme*n* 2>/dev/null | wc -l; }
heads_are() { [ "$(head_count "$1")" -eq "$2" ]; }

# legs_ready SUBSYS N: every head of SUBSYS has N hidden legs.
legs_ready() {
	local sub=$1 n=$2 h legs sn hn
	for h in /sys/class/nvme-subsystem/"$sub"/nvme*n*; do
		[ -e "$h" ] || return 1
		h=$(basename "$h")
		sn=${h#nvme}
		hn=${sn#*n}
		sn=${sn%%n*}
		legs=$(ls -d /sys/class/nvme/nvme*/nvme"${sn}"c*n"${hn}" 2>/dev/null | wc -l)
		[ "$legs" -eq "$n" ] || return 1
	done
}

subsys_of_ctrl() {
	local s
	for s in /sys/class/nvme-subsystem/*; do
		[ -e "$s/$1" ] && basename "$s" && return 0
	done
	return 1
}

fixture_nvme_healthy() {
	local a=$NQN_PREFIX:healthy-a b=$NQN_PREFIX:healthy-b ca cb
	nvme_two_port_target "$a" 3
	nvme_two_port_target "$b" 1
	ca=$(nvme_connect_both "$a")
	cb=$(nvme_connect_both "$b")
	lab_wait 20 "3 namespaces with 2 legs on $a" legs_ready "$(subsys_of_ctrl "${ca%% *}")" 2
	lab_wait 20 "1 namespace with 2 legs on $b" legs_ready "$(subsys_of_ctrl "${cb%% *}")" 2
	capture nvme-healthy \
		"two NVMe/TCP subsystems ($a with namespaces 1-3, $b with namespace 1), each reached through two ports: 127.0.0.1:4420 (ANA group 1 optimized) and 127.0.0.1:4421 (non-optimized); native multipath on" \
		"zero defects: every controller live, every namespace head has two legs, one optimized and one non-optimized"
}

fixture_nvme_no_namespace() {
	local nqn=$NQN_PREFIX:empty c
	nvme_two_port_target "$nqn" 0
	c=$(nvme_connect_both "$nqn")
	sleep 2 # a namespace scan would have shown up by now
	[ "$(head_count "$(subsys_of_ctrl "${c%% *}")")" -eq 0 ] || lab_fail "namespaces appeared"
	capture nvme-no-namespace \
		"subsystem $nqn that exports no namespace, connected through 127.0.0.1:4420 and 127.0.0.1:4421" \
		"both controllers live, the subsystem has zero namespace heads (NoNamespace)"
}

fixture_nvme_namespace_missing() {
	local nqn=$NQN_PREFIX:shared c sub
	nvme_two_port_target "$nqn" 3
	c=$(nvme_connect_both "$nqn")
	sub=$(subsys_of_ctrl "${c%% *}")
	lab_wait 20 "3 namespaces with 2 legs" legs_ready "$sub" 2
	nvmet_ns_disable "$nqn" 2
	lab_wait 20 "namespace 2 to disappear" heads_are "$sub" 2
	capture nvme-namespace-missing \
		"subsystem $nqn shared by three namespaces (co-tenants) over two ports; namespace 2 was then disabled on the target" \
		"both controllers live; heads for namespaces 1 and 3 with two legs each; no head for nsid 2 (its volume's namespace is missing, its co-tenants are healthy)"
}

fixture_nvme_controller_not_contributing() {
	local nqn=$NQN_PREFIX:shared-array alias=$NQN_PREFIX:shared-array-node-b a b ca cb sub msg
	nvmet_port_create 1 127.0.0.1 4420
	nvmet_port_ana 1 1 optimized
	# Target A hands out cntlids 1-99, target B 100-199; each exports
	# nsid 1 backed by its own device with its own UUID.
	nvmet_subsys_create "$nqn" 1 99
	nvmet_subsys_create "$alias" 100 199
	a=$(lab_loop_create array-a 64)
	b=$(lab_loop_create array-b 64)
	nvmet_ns_add "$nqn" 1 "$a" 1 "$(lab_uuid_of "$nqn/a/1")"
	nvmet_ns_add "$alias" 1 "$b" 1 "$(lab_uuid_of "$nqn/b/1")"
	nvmet_port_link 1 "$nqn"
	nvmet_port_link 1 "$alias"
	# Target B answers as $nqn on 127.0.0.3:4420.
	nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 "$nqn" "$alias"
	ca=$(nvme_host_connect "$nqn" 127.0.0.1 4420 "$CONNECT_OPTS")
	cb=$(nvme_host_connect "$nqn" 127.0.0.3 4420 "$CONNECT_OPTS")
	nvme_wait_state "$ca" live
	nvme_wait_state "$cb" live
	sleep 2
	sub=$(subsys_of_ctrl "$ca")
	[ "$(subsys_of_ctrl "$cb")" = "$sub" ] || lab_fail "controllers landed in different subsystems: AmbiguousHead, not this fixture"
	msg=$(dmesg | grep -o "$cb: IDs don't match for shared namespace [0-9]*" | tail -1 || true)
	lab_log "kernel: ${msg:-no message}"
	capture nvme-controller-not-contributing \
		"two targets share subsystem NQN $nqn with disjoint controller ID ranges (1-99 and 100-199); each exports nsid 1 with its own UUID; the host connects to both (127.0.0.1:4420 and 127.0.0.3:4420)" \
		"one subsystem instance holding both controllers, both live; one namespace head with a single leg via the first controller; the second controller (cntlid 100) contributes no leg" \
		"Linux 6.1 puts both controllers in the same nvme-subsystem (it matches subsystems by NQN only) and refuses the second namespace: '${msg:-<message not found>}'" \
		"target B is a second nvmet subsystem presented under the shared NQN by hack/lab/nqnproxy; its own serial ($(printf '%s' "$alias" | md5sum | cut -c1-20)) appears nowhere: a controller's serial attribute reads its subsystem's"
}

fixture_nvme_path_reconnecting() {
	local nqn=$NQN_PREFIX:flaky c c2
	nvme_two_port_target "$nqn" 1
	c=$(nvme_connect_both "$nqn")
	c2=${c##* }
	lab_wait 20 "namespace with 2 legs" legs_ready "$(subsys_of_ctrl "$c2")" 2
	nvmet_port_unlink 2 "$nqn"
	nvme_wait_state "$c2" connecting 30
	sleep 3 # at least one failed reconnect attempt
	capture nvme-path-reconnecting \
		"subsystem $nqn over two ports; port 2 (127.0.0.1:4421) was then unlinked from the subsystem on the target" \
		"controller on 4420 live with its optimized leg; controller on 4421 in state connecting (reconnect_delay 2), its address without src_addr, its leg keeping the last ana_state"
}

# iscsi_target IQN LUNS builds a LIO target with LUNS LUNs on loop devices
# and portals 127.0.0.1:3260 and 127.0.0.2:3260.
iscsi_target() {
	local iqn=$1 luns=$2 i dev tag
	tag=${iqn##*:}
	lio_target_create "$iqn" 1
	for ((i = 0; i < luns; i++)); do
		dev=$(lab_loop_create "$tag-lun$i" 64)
		lio_backstore_iblock "$tag-lun$i" "$dev"
		lio_lun_add "$iqn" 1 "$i" "$tag-lun$i"
	done
	lio_portal_add "$iqn" 1 127.0.0.1
	lio_portal_add "$iqn" 1 127.0.0.2
	lio_tpg_enable "$iqn" 1
}

# iscsi_login_both IQN [KEY VALUE]... discovers and logs in through both
# portals, applying node settings first.
iscsi_login_both() {
	local iqn=$1 p
	shift
	iscsi_host_start
	iscsi_discover 127.0.0.1 >/dev/null
	local args
	for p in 127.0.0.1:3260 127.0.0.2:3260; do
		args=("$@")
		while [ ${#args[@]} -ge 2 ]; do
			iscsi_node_set "$iqn" "$p" "${args[0]}" "${args[1]}"
			args=("${args[@]:2}")
		done
		iscsi_login "$iqn" "$p" >/dev/null
	done
	lab_wait 30 "LUNs of both sessions" iscsi_luns_ready "$iqn"
	udevadm settle --timeout=20 || true
}

iscsi_luns_ready() {
	local s1 s2
	s1=$(iscsi_session_of "$1" 127.0.0.1:3260) && s2=$(iscsi_session_of "$1" 127.0.0.2:3260) || return 1
	[ -n "$(iscsi_disks_of "$s1")" ] && [ -n "$(iscsi_disks_of "$s2")" ]
}

dm_maps_ready() { [ "$(ls -d /sys/block/dm-* 2>/dev/null | wc -l)" -ge "$1" ]; }

fixture_iscsi_healthy() {
	local iqn=$IQN_PREFIX:healthy
	iscsi_target "$iqn" 2
	lio_chap "$iqn" 1 pathmend-lab lab-chap-secret
	multipathd_start
	iscsi_login_both "$iqn" node.session.auth.authmethod CHAP \
		node.session.auth.username pathmend-lab node.session.auth.password lab-chap-secret
	lab_wait 30 "two multipath maps" dm_maps_ready 2
	udevadm settle --timeout=20 || true
	multipath -ll >&2 || true
	capture iscsi-healthy \
		"LIO target $iqn (CHAP) with LUNs 0 and 1 behind portals 127.0.0.1:3260 and 127.0.0.2:3260; one session per portal; multipathd running" \
		"two sessions LOGGED_IN with connections up; each LUN seen as one sdX per session; one dm-multipath map per LUN with both sdX as slaves"
}

fixture_iscsi_session_failed() {
	local iqn=$IQN_PREFIX:failing s
	iscsi_target "$iqn" 1
	iscsi_login_both "$iqn" node.session.timeo.replacement_timeout 600
	s=$(iscsi_session_of "$iqn" 127.0.0.2:3260)
	fault_drop_port 3260 127.0.0.2
	iscsi_wait_state "$s" FAILED 90
	sleep 1
	capture iscsi-session-failed \
		"LIO target $iqn, one LUN behind portals 127.0.0.1:3260 and 127.0.0.2:3260, one session each, no multipathd; packets to 127.0.0.2:3260 were then dropped (iptables)" \
		"the session through 127.0.0.1 LOGGED_IN; the session through 127.0.0.2 FAILED (recovery_tmo 600, not expired) with its connection failed and its disk blocked; the other session healthy"
}

fixture_iscsi_session_free() {
	local iqn=$IQN_PREFIX:lost s
	iscsi_target "$iqn" 1
	iscsi_login_both "$iqn" node.session.timeo.replacement_timeout 5
	s=$(iscsi_session_of "$iqn" 127.0.0.2:3260)
	fault_drop_port 3260 127.0.0.2
	iscsi_wait_state "$s" FAILED 90
	iscsi_wait_state "$s" FREE 60
	sleep 1
	capture iscsi-session-free \
		"LIO target $iqn, one LUN behind portals 127.0.0.1:3260 and 127.0.0.2:3260, one session each, no multipathd, replacement_timeout 5; packets to 127.0.0.2:3260 were then dropped (iptables) until the recovery timeout expired" \
		"the session through 127.0.0.1 LOGGED_IN; the session through 127.0.0.2 FREE (recovery timed out) with its connection failed and its disk transport-offline"
}

fixture_iscsi_session_stuck() {
	local iqn=$IQN_PREFIX:stuck s p attempt
	iscsi_target "$iqn" 1
	flakyproxy_start 127.0.0.3:3260 127.0.0.2:3260
	iscsid_foreground
	multipathd_start
	for p in 127.0.0.1:3260 127.0.0.3:3260; do
		iscsiadm -m node -T "$iqn" -p "$p" -o new >/dev/null
		iscsi_login "$iqn" "$p" >/dev/null
	done
	lab_wait 30 "two paths in the map" sh -c '[ "$(ls /sys/block/dm-*/slaves 2>/dev/null | wc -l)" -ge 2 ]'
	s=$(iscsi_session_of "$iqn" 127.0.0.3:3260)
	for attempt in 1 2 3 4 5; do
		iscsi_make_stuck "$s" && break
		[ "$attempt" -eq 5 ] && lab_fail "no stuck session in 5 attempts: iscsid recovered each time"
	done
	udevadm settle --timeout=20 || true
	capture iscsi-session-stuck \
		"LIO target $iqn, one LUN behind portals 127.0.0.1:3260 and 127.0.0.2:3260; logged in through 127.0.0.1:3260 and through hack/lab/flakyproxy on 127.0.0.3:3260 (in front of 127.0.0.2:3260); multipathd running; the proxy reset the second session's reopens after their bind until the session was stuck (open-iscsi #387), then passed traffic again" \
		"the session through 127.0.0.1 LOGGED_IN; the session through 127.0.0.3 FREE although its portal accepts connections again: iscsid logs \"can't bind conn N:0 to session N, retcode -107\" every few seconds; its disk transport-offline; the map keeps one live path" \
		"in sysfs a stuck session looks like any FREE session; only time in state with the portal reachable tells it apart" \
		"iscsid's last line when captured: $(grep 'retcode -107' "$ISCSID_LOG" | tail -n 1)"
}

# head_of SUBSYS NSID prints the namespace head of NSID in SUBSYS.
head_of() {
	local h
	for h in /sys/class/nvme-subsystem/"$1"/nvme*n*; do
		[[ $(basename "$h") =~ ^nvme[0-9]+n[0-9]+$ ]] || continue
		[ "$(cat "$h/nsid")" = "$2" ] && basename "$h" && return 0
	done
	return 1
}

# fs_health_unmount unmounts what fixture_fs_health mounted.
fs_health_unmount() {
	local m
	for m in /tmp/fs-health-1 /tmp/fs-health-2 /tmp/fs-health-3; do
		mountpoint -q "$m" && umount "$m"
	done
	return 0
}

fixture_fs_health() {
	local nqn=$NQN_PREFIX:fs-health c sub i dev h1 h2 h3
	nvme_ports
	nvmet_subsys_create "$nqn"
	for i in 1 2 3; do
		# XFS wants 300 MB at least; the loop files are sparse.
		dev=$(lab_loop_create "fs-health-ns$i" 512)
		nvmet_ns_add "$nqn" "$i" "$dev" 1 "$(lab_uuid_of "$nqn/$i")"
	done
	nvmet_port_link 1 "$nqn"
	nvmet_port_link 2 "$nqn"
	c=$(nvme_connect_both "$nqn")
	sub=$(subsys_of_ctrl "${c%% *}")
	lab_wait 20 "3 namespaces with 2 legs" legs_ready "$sub" 2
	h1=$(head_of "$sub" 1) && h2=$(head_of "$sub" 2) && h3=$(head_of "$sub" 3)
	mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "/dev/$h1"
	mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "/dev/$h2"
	mkfs.xfs -q -f "/dev/$h3"
	trap 'fs_health_unmount; lab_teardown_all' EXIT
	mkdir -p /tmp/fs-health-1 /tmp/fs-health-2 /tmp/fs-health-3
	mount -o errors=remount-ro "/dev/$h1" /tmp/fs-health-1
	mount -o errors=remount-ro "/dev/$h2" /tmp/fs-health-2
	mount -o nouuid "/dev/$h3" /tmp/fs-health-3
	printf "written before the capture\n" >/tmp/fs-health-2/data && sync
	echo "pathmend fixture" >"/sys/fs/ext4/$h1/trigger_fs_error"
	if touch /tmp/fs-health-1/after 2>/dev/null; then lab_fail "ext4 on $h1 still takes writes after its error"; fi
	capture fs-health \
		"subsystem $nqn with namespaces 1-3 over two ports; namespace 1 ($h1) and 2 ($h2) ext4 mounted with errors=remount-ro, namespace 3 ($h3) XFS mounted; an ext4 error raised on $h1 through /sys/fs/ext4/$h1/trigger_fs_error (ext4 stops taking writes; the mount table still says rw)" \
		"fs/ext4/$h1: errors_count 1 and its first and last error (trigger_test_error): read-only; fs/ext4/$h2: errors_count 0: healthy; fs/xfs/$h3 present (XFS publishes no shutdown state in sysfs: a stat of a shut-down XFS answers EIO)"
	fs_health_unmount
}

FIXTURES=(nvme-healthy nvme-no-namespace nvme-namespace-missing nvme-controller-not-contributing
	nvme-path-reconnecting iscsi-healthy iscsi-session-failed iscsi-session-free iscsi-session-stuck fs-health)

main() {
	local name=${1:-}
	if [ "$name" = list ]; then
		printf '%s\n' "${FIXTURES[@]}"
		return 0
	fi
	declare -F "fixture_${name//-/_}" >/dev/null || lab_fail "unknown fixture '$name' (list: ${FIXTURES[*]})"
	trap lab_teardown_all EXIT
	lab_log "fixture $name: building targets"
	"fixture_${name//-/_}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	main "$@"
fi
