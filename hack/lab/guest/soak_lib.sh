# shellcheck shell=bash
# pathmend lab: the soak's targets and faults (hack/lab/soak). Sourced
# after targets.sh, by guest/soak.sh and by the soak binary for every
# fault it injects through configfs or iptables.
#
#   NVMe subsystem A (two namespaces: vol-a1 ext4, vol-a2 raw block):
#     port 1 127.0.0.1:4420 ANA optimized, port 2 127.0.0.2:4421 non-optimized
#   NVMe subsystem B (vol-b ext4): array B1 on port 3 127.0.0.1:4422
#     (optimized); array B2, a second nvmet subsystem presented under B's
#     NQN by nqnproxy on 127.0.0.3:4423 (upstream port 4 127.0.0.2:4423,
#     non-optimized), its namespace a replica of B1's (same device, same
#     UUID) — so ControllerNotContributing can be forced on it
#   iSCSI target I (vol-i ext4 on dm-multipath): TPG 1 on 127.0.0.1:3260,
#     TPG 2 on 127.0.0.2:3260 behind the soak's flaky proxy on
#     127.0.0.3:3260, one LUN exported by both TPGs
#   NVMe subsystem C (vol-c ext4, a short fast_io_fail_tmo: the
#     filesystem-error fault outlasts its queueing window): port 5
#     127.0.0.1:4424 optimized, port 6 127.0.0.2:4425 non-optimized
SOAK_NQN_A=nqn.2024-01.io.pathmend.lab:soak-a
SOAK_NQN_B=nqn.2024-01.io.pathmend.lab:soak-b
SOAK_NQN_B2=nqn.2024-01.io.pathmend.lab:soak-b2
SOAK_IQN=iqn.2024-01.io.pathmend.lab:soak-i
SOAK_NQN_C=nqn.2024-01.io.pathmend.lab:soak-c

# soak_targets_up builds every target, and starts iscsid (with its
# restart script for pathmend) and multipathd.
soak_targets_up() {
	local a1 a2 b c
	modprobe nvme_tcp || return
	nvmet_subsys_create "$SOAK_NQN_A" || return
	a1=$(lab_loop_create soak-a1 64) && a2=$(lab_loop_create soak-a2 64) || return
	nvmet_ns_add "$SOAK_NQN_A" 1 "$a1" 1 "$(lab_uuid_of "$SOAK_NQN_A/1")" || return
	nvmet_ns_add "$SOAK_NQN_A" 2 "$a2" 1 "$(lab_uuid_of "$SOAK_NQN_A/2")" || return
	nvmet_port_create 1 127.0.0.1 4420 && nvmet_port_ana 1 1 optimized || return
	nvmet_port_create 2 127.0.0.2 4421 && nvmet_port_ana 2 1 non-optimized || return
	nvmet_port_link 1 "$SOAK_NQN_A" && nvmet_port_link 2 "$SOAK_NQN_A" || return

	nvmet_subsys_create "$SOAK_NQN_B" 1 99 && nvmet_subsys_create "$SOAK_NQN_B2" 100 199 || return
	b=$(lab_loop_create soak-b 64) || return
	nvmet_ns_add "$SOAK_NQN_B" 1 "$b" 1 "$(lab_uuid_of "$SOAK_NQN_B/1")" || return
	nvmet_ns_add "$SOAK_NQN_B2" 1 "$b" 1 "$(lab_uuid_of "$SOAK_NQN_B/1")" || return
	nvmet_port_create 3 127.0.0.1 4422 && nvmet_port_ana 3 1 optimized || return
	nvmet_port_create 4 127.0.0.2 4423 && nvmet_port_ana 4 1 non-optimized || return
	nvmet_port_link 3 "$SOAK_NQN_B" && nvmet_port_link 4 "$SOAK_NQN_B2" || return
	nqnproxy_start 127.0.0.3:4423 127.0.0.2:4423 "$SOAK_NQN_B" "$SOAK_NQN_B2" || return

	nvmet_subsys_create "$SOAK_NQN_C" || return
	c=$(lab_loop_create soak-c 64) || return
	nvmet_ns_add "$SOAK_NQN_C" 1 "$c" 1 "$(lab_uuid_of "$SOAK_NQN_C/1")" || return
	nvmet_port_create 5 127.0.0.1 4424 && nvmet_port_ana 5 1 optimized || return
	nvmet_port_create 6 127.0.0.2 4425 && nvmet_port_ana 6 1 non-optimized || return
	nvmet_port_link 5 "$SOAK_NQN_C" && nvmet_port_link 6 "$SOAK_NQN_C" || return

	lio_target_create "$SOAK_IQN" 1 && lio_target_create "$SOAK_IQN" 2 || return
	lio_backstore_iblock soak-i "$(lab_loop_create soak-i 64)" || return
	lio_lun_add "$SOAK_IQN" 1 0 soak-i && lio_lun_add "$SOAK_IQN" 2 0 soak-i || return
	lio_portal_add "$SOAK_IQN" 1 127.0.0.1 && lio_portal_add "$SOAK_IQN" 2 127.0.0.2 || return
	lio_tpg_enable "$SOAK_IQN" 1 && lio_tpg_enable "$SOAK_IQN" 2 || return
	iscsid_foreground || return
	multipathd_start
}

# soak_not_contributing on|off gives array B2's namespace another UUID
# (on: the kernel refuses it on B2's controller, which stays live and
# contributes no path) or B1's again (off).
soak_not_contributing() {
	local uuid ns=$NVMET/subsystems/$SOAK_NQN_B2/namespaces/1
	uuid=$(lab_uuid_of "$SOAK_NQN_B/1")
	[ "$1" = on ] && uuid=$(lab_uuid_of "$SOAK_NQN_B2/other")
	echo 0 >"$ns/enable" && echo "$uuid" >"$ns/device_uuid" && echo 1 >"$ns/enable"
}

# soak_queue_window prints how long dm-multipath queues I/O for the map
# DEV (dm-N) with every path down, in seconds: no_path_retry checks ×
# polling_interval. Nothing when the map does not queue for a bounded time.
soak_queue_window() {
	local checks pi
	checks=$(multipathd show maps raw format "%d %Q" | awk -v d="$1" '$1 == d && $3 == "chk" { print $2 }')
	pi=$(multipathd show config local | awk '$1 == "polling_interval" { print $2; exit }')
	[ -n "$checks" ] && [ -n "$pi" ] && echo $((checks * pi))
}
