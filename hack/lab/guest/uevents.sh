#!/bin/bash
# pathmend lab: record the kernel's uevents while the fault catalogue
# runs. Run in the guest as
#
#   bash /lab/guest/uevents.sh
#
# hack/lab/uevents records every kernel uevent (NETLINK_KOBJECT_UEVENT,
# the kernel's group) into /lab/out/uevents/events.jsonl; each fault is
# framed by two marks in marks.jsonl: begin just before the action, end
# once sysfs shows the state the fault leads to plus a settling time
# (SETTLE seconds, for events that trail it). The host splits the events
# by fault into testdata/uevents (make lab-uevents). Faults run in the
# order of ueventtest.Order, each from the state the one before left;
# what happens between a fault's end and the next one's begin (setting
# targets up) is not recorded.
set -uo pipefail
LAB=${LAB:-/lab}
LAB_BIN=${LAB_BIN:-$LAB/bin}
# shellcheck source=targets.sh
. "$LAB/guest/targets.sh"

OUT=$LAB/out/uevents
EV=$OUT/events.jsonl
MK=$OUT/marks.jsonl
NQN=nqn.2024-01.io.pathmend.lab:uevents
IQN=iqn.2024-01.io.pathmend.lab:uevents
SETTLE=${UEVENTS_SETTLE:-2}
CONNECT_OPTS=reconnect_delay=2,ctrl_loss_tmo=600
CUR=

die() {
	lab_log "uevents: FAILED in ${CUR:-setup}: $*"
	exit 1
}

# begin NAME TEXT marks the start of fault NAME (TEXT: what is done).
begin() {
	CUR=$1
	lab_log "fault $1: $2"
	"$LAB_BIN/uevents" mark -o "$MK" -fault "$1" -phase begin -do "$2" || die "mark"
}

# end UNTIL [SETTLE] COMMAND... waits (60 s at most) until COMMAND
# succeeds, then SETTLE seconds more, and marks the end of the fault.
end() {
	local until=$1 settle=$SETTLE
	shift
	if [[ ${1:-} =~ ^[0-9]+$ ]]; then
		settle=$1
		shift
	fi
	lab_wait 60 "$until" "$@" || die "$until"
	sleep "$settle"
	"$LAB_BIN/uevents" mark -o "$MK" -fault "$CUR" -phase end -until "$until (+${settle} s)" || die "mark"
}

ctrl_gone() { [ ! -e "/sys/class/nvme/$1" ]; }
ctrl_state_in() {
	local s
	s=$(cat "/sys/class/nvme/$1/state" 2>/dev/null) || return 1
	shift
	for x in "$@"; do [ "$s" = "$x" ] && return 0; done
	return 1
}
# subsys_of CTRL: the subsystem instance holding controller CTRL.
subsys_of() {
	local s
	for s in /sys/class/nvme-subsystem/nvme-subsys*; do
		[ -e "$s/$1" ] && basename "$s" && return 0
	done
	return 1
}
heads() { ls -d /sys/class/nvme-subsystem/"$SUBSYS"/nvme*n* 2>/dev/null | wc -l; }
heads_are() { [ "$(heads)" -eq "$1" ]; }
legs_of() { ls -d /sys/class/nvme/"$1"/nvme*c*n* 2>/dev/null | wc -l; }
leg_ana_is() {
	local l
	for l in /sys/class/nvme/"$1"/nvme*c*n*; do
		[ "$(cat "$l/ana_state" 2>/dev/null)" = "$2" ] || return 1
	done
}
live_with_head() { nvme_state_is "$1" live && heads_are 1; }
no_controllers() { ! ls /sys/class/nvme/nvme* >/dev/null 2>&1; }

sessions() { ls -d /sys/class/iscsi_session/session* 2>/dev/null | wc -l; }
sessions_are() { [ "$(sessions)" -eq "$1" ]; }
session_gone() { [ ! -e "/sys/class/iscsi_session/$1" ]; }
session_state_in() {
	local s
	s=$(cat "/sys/class/iscsi_session/$1/state" 2>/dev/null) || return 1
	shift
	for x in "$@"; do [ "$s" = "$x" ] && return 0; done
	return 1
}
disks_of_are() { [ "$(iscsi_disks_of "$1" | wc -l)" -eq "$2" ]; }
# map_of DISK: the dm map holding DISK ("dm-0"), if any.
map_of() { ls /sys/block/"$1"/holders 2>/dev/null | head -n 1; }
map_slaves_are() { [ -n "$1" ] && [ "$(ls /sys/block/"$1"/slaves 2>/dev/null | wc -l)" -eq "$2" ]; }
disk_has_map() { [ -n "$(map_of "$1")" ]; }
disk_has_no_map() { [ -z "$(map_of "$1")" ]; }
two_disks_each() { disks_of_are "$1" 2 && disks_of_are "$2" 2; }
first_disk_in_map() {
	local d
	d=$(iscsi_disks_of "$1" | head -n 1)
	[ -n "$d" ] && disk_has_map "$d"
}
disk_gone() { [ ! -e "/sys/block/$1" ]; }
no_sessions() { sessions_are 0; }

nvme_catalogue() {
	local c1 c2 dev2 leg
	nvmet_port_create 1 127.0.0.1 4420 || die "port 1"
	nvmet_port_create 2 127.0.0.1 4421 || die "port 2"
	nvmet_port_ana 1 1 optimized
	nvmet_port_ana 2 1 non-optimized
	nvmet_subsys_create "$NQN" || die "subsystem"
	nvmet_ns_add "$NQN" 1 "$(lab_loop_create uevents-ns1 64)" 1 "$(lab_uuid_of "$NQN/1")" || die "namespace 1"
	dev2=$(lab_loop_create uevents-ns2 64) || die "loop"
	nvmet_port_link 1 "$NQN"
	nvmet_port_link 2 "$NQN"
	modprobe nvme_tcp || die "nvme_tcp"
	sleep 1

	begin nvme-connect "connect the first path: write \"transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=…,$CONNECT_OPTS\" to /dev/nvme-fabrics"
	c1=$(nvme_host_connect "$NQN" 127.0.0.1 4420 "$CONNECT_OPTS") || die "connect"
	SUBSYS=$(subsys_of "$c1")
	end "$c1 live, its head present" live_with_head "$c1"

	begin nvme-connect-second "connect the second path (127.0.0.1:4421, ANA non-optimized)"
	c2=$(nvme_host_connect "$NQN" 127.0.0.1 4421 "$CONNECT_OPTS") || die "connect"
	end "$c2 live with its leg" sh -c "[ \"\$(cat /sys/class/nvme/$c2/state)\" = live ] && ls -d /sys/class/nvme/$c2/nvme*c*n* >/dev/null 2>&1"

	begin nvme-controller-delete "echo 1 > /sys/class/nvme/$c2/delete_controller (a live controller, another path live)"
	nvme_host_delete "$c2"
	end "$c2 gone" ctrl_gone "$c2"

	begin nvme-reconnect "connect 127.0.0.1:4421 again"
	c2=$(nvme_host_connect "$NQN" 127.0.0.1 4421 "$CONNECT_OPTS") || die "connect"
	end "$c2 live with its leg" sh -c "[ \"\$(cat /sys/class/nvme/$c2/state)\" = live ] && ls -d /sys/class/nvme/$c2/nvme*c*n* >/dev/null 2>&1"

	begin nvme-port-unlink "target: unlink the subsystem from port 2 (rm ports/2/subsystems/<nqn>)"
	nvmet_port_unlink 2 "$NQN"
	end "$c2 connecting" ctrl_state_in "$c2" connecting

	begin nvme-port-relink "target: link the subsystem to port 2 again (reconnect_delay 2)"
	nvmet_port_link 2 "$NQN"
	end "$c2 live" nvme_state_is "$c2" live

	begin nvme-ana-inaccessible "target: ANA group 1 of port 2 inaccessible"
	nvmet_port_ana 2 1 inaccessible
	end "$c2's leg inaccessible" leg_ana_is "$c2" inaccessible

	begin nvme-ana-restore "target: ANA group 1 of port 2 non-optimized again"
	nvmet_port_ana 2 1 non-optimized
	end "$c2's leg non-optimized" leg_ana_is "$c2" non-optimized

	begin nvme-controller-reset "echo 1 > /sys/class/nvme/$c2/reset_controller"
	echo 1 >"/sys/class/nvme/$c2/reset_controller"
	end "$c2 live" nvme_state_is "$c2" live

	begin nvme-rescan "echo 1 > /sys/class/nvme/$c2/rescan_controller (nothing changed)"
	echo 1 >"/sys/class/nvme/$c2/rescan_controller"
	end "$c2 live" nvme_state_is "$c2" live

	begin nvme-namespace-disable "target: disable namespace 1, the only one (echo 0 > namespaces/1/enable)"
	nvmet_ns_disable "$NQN" 1
	end "no head left, both controllers live" heads_are 0

	begin nvme-namespace-enable "target: enable namespace 1 again"
	nvmet_ns_enable "$NQN" 1
	end "the head back with both legs" sh -c "[ \$(ls -d /sys/class/nvme/$c1/nvme*c*n* /sys/class/nvme/$c2/nvme*c*n* 2>/dev/null | wc -l) -eq 2 ]"

	begin nvme-namespace-add "target: add and enable namespace 2"
	nvmet_ns_add "$NQN" 2 "$dev2" 1 "$(lab_uuid_of "$NQN/2")" || die "namespace 2"
	end "two heads" heads_are 2

	begin nvme-port-drop "iptables: DROP every packet to port 4421 (kato 5 s)"
	fault_drop_port 4421
	end "$c2 connecting" ctrl_state_in "$c2" connecting

	begin nvme-port-restore "iptables: accept port 4421 again"
	fault_restore_port 4421
	end "$c2 live" nvme_state_is "$c2" live

	begin nvme-ctrl-loss "echo 3 > /sys/class/nvme/$c2/ctrl_loss_tmo; target: unlink port 2 — the kernel gives the controller up and deletes it"
	echo 3 >"/sys/class/nvme/$c2/ctrl_loss_tmo" || die "ctrl_loss_tmo"
	nvmet_port_unlink 2 "$NQN"
	end "$c2 gone" ctrl_gone "$c2"
	nvmet_port_link 2 "$NQN"

	begin nvme-disconnect-last "echo 1 > /sys/class/nvme/$c1/delete_controller (the last path)"
	nvme_host_delete "$c1"
	end "no controller, no head" no_controllers
}

iscsi_catalogue() {
	local s1 s2 sd1 sd2 map lun1 x
	lio_backstore_iblock ue0 "$(lab_loop_create uevents-lun0 64)" || die "backstore"
	lio_backstore_iblock ue1 "$(lab_loop_create uevents-lun1 64)" || die "backstore"
	lio_target_create "$IQN" 1 || die "target"
	lio_portal_add "$IQN" 1 127.0.0.1 || die "portal"
	lio_portal_add "$IQN" 1 127.0.0.2 || die "portal"
	lio_lun_add "$IQN" 1 0 ue0 || die "lun"
	lio_tpg_enable "$IQN" 1
	iscsi_host_start || die "iscsid"
	multipathd_start || die "multipathd"
	iscsi_discover 127.0.0.1:3260 >/dev/null || die "discovery"
	sleep 1

	begin iscsi-login "iscsiadm -m node -T <iqn> -p 127.0.0.1:3260 --login (multipathd running)"
	iscsi_login "$IQN" 127.0.0.1:3260 >/dev/null || die "login"
	s1=$(iscsi_session_of "$IQN" 127.0.0.1:3260) || die "session"
	end "$s1 LOGGED_IN, its disk in a map" first_disk_in_map "$s1"
	sd1=$(iscsi_disks_of "$s1" | head -n 1)
	map=$(map_of "$sd1")

	begin iscsi-login-second "iscsiadm … -p 127.0.0.2:3260 --login (the second portal)"
	iscsi_login "$IQN" 127.0.0.2:3260 >/dev/null || die "login"
	s2=$(iscsi_session_of "$IQN" 127.0.0.2:3260) || die "session"
	end "$map with two paths" map_slaves_are "$map" 2
	sd2=$(iscsi_disks_of "$s2" | head -n 1)

	begin iscsi-session-fail "iptables: DROP every packet to 127.0.0.2:3260"
	fault_drop_port 3260 127.0.0.2
	end "$s2 FAILED or FREE" 8 session_state_in "$s2" FAILED FREE

	begin iscsi-session-recover "iptables: accept 127.0.0.2:3260 again"
	fault_restore_port 3260 127.0.0.2
	end "$s2 LOGGED_IN" 4 session_state_in "$s2" LOGGED_IN

	begin iscsi-logout "iscsiadm … -p 127.0.0.2:3260 --logout"
	timeout 60 iscsiadm -m node -T "$IQN" -p 127.0.0.2:3260 --logout >/dev/null || die "logout"
	end "$s2 gone" session_gone "$s2"

	begin iscsi-login-again "iscsiadm … -p 127.0.0.2:3260 --login"
	iscsi_login "$IQN" 127.0.0.2:3260 >/dev/null || die "login"
	s2=$(iscsi_session_of "$IQN" 127.0.0.2:3260) || die "session"
	end "$map with two paths" map_slaves_are "$map" 2
	sd2=$(iscsi_disks_of "$s2" | head -n 1)

	begin iscsi-lun-rescan "target: export LUN 1; iscsiadm -m session --rescan"
	lio_lun_add "$IQN" 1 1 ue1 || die "lun 1"
	timeout 60 iscsiadm -m session --rescan >/dev/null || die "rescan"
	end "two disks on each session" two_disks_each "$s1" "$s2"
	lun1=
	for x in $(iscsi_disks_of "$s2"); do [ "$x" != "$sd2" ] && lun1=$x; done
	[ -n "$lun1" ] || die "LUN 1's disk on $s2"

	begin iscsi-lun-delete "echo 1 > /sys/block/$lun1/device/delete (LUN 1 through the second session)"
	echo 1 >"/sys/block/$lun1/device/delete"
	end "$lun1 gone" disk_gone "$lun1"

	begin dm-map-flush "multipath -f <wwid> (LUN 0's map, both paths live)"
	timeout 30 multipath -f "$(cat "/sys/block/$map/dm/name")" >/dev/null || die "flush"
	end "$sd1 in no map" disk_has_no_map "$sd1"

	begin dm-map-create "multipath /dev/$sd1 (create LUN 0's map again)"
	timeout 30 multipath "/dev/$sd1" >/dev/null || die "create"
	end "$sd1 in a map" disk_has_map "$sd1"

	begin iscsi-logout-last "iscsiadm -m node --logoutall=all"
	timeout 60 iscsiadm -m node --logoutall=all >/dev/null || die "logout"
	end "no session" no_sessions
}

main() {
	mkdir -p "$OUT"
	: >"$MK"
	uname -r >"$OUT/kernel.txt"
	awk '{ for (i = 1; i < NF; i++) if ($i == "Debian") v = $(i + 1) } END { print v }' /proc/version >>"$OUT/kernel.txt"
	"$LAB_BIN/uevents" record -o "$EV" 2>"$OUT/recorder.log" &
	REC=$!
	lab_wait 10 "the recorder" grep -q '^recording' "$OUT/recorder.log" || die "recorder"
	nvme_catalogue
	iscsi_catalogue
	CUR=
	sleep 1
	kill -TERM "$REC"
	wait "$REC" || die "recorder exited $?"
	lab_teardown_all
	lab_log "uevents: $(wc -l <"$EV") events, $(($(wc -l <"$MK") / 2)) faults recorded"
}

main "$@"
