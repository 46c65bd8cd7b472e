# shellcheck shell=bash
# pathmend lab: guest-side target and fault helpers. Source it in bash:
#
#   . /lab/guest/targets.sh
#
# Everything is driven through configfs (nvmet, LIO) and the kernel's own
# interfaces (/dev/nvme-fabrics, sysfs); no targetcli or nvmetcli. All
# targets listen on the guest's loopback (127.0.0.x). Functions return
# non-zero with a message on stderr when something fails; every wait is
# bounded.
#
# NVMe-oF/TCP target (nvmet):
#   nvmet_subsys_create NQN [cntlid_min cntlid_max]
#   nvmet_ns_add NQN NSID DEVICE [ANA_GROUP [UUID]]
#   nvmet_ns_enable NQN NSID / nvmet_ns_disable NQN NSID
#   nvmet_port_create PORT_ID TRADDR TRSVCID
#   nvmet_port_link PORT_ID NQN / nvmet_port_unlink PORT_ID NQN
#   nvmet_port_ana PORT_ID GROUP optimized|non-optimized|inaccessible|...
#   nvmet_teardown_all
# NVMe-oF/TCP host (writes /dev/nvme-fabrics, as pathmend does):
#   nvme_host_connect NQN TRADDR TRSVCID [OPTIONS] -> prints nvmeN
#   nvme_host_delete CTRL / nvme_host_delete_all
#   nvme_wait_state CTRL STATE [SECONDS]
# iSCSI target (LIO):
#   lio_backstore_iblock NAME DEVICE
#   lio_target_create IQN TPGT
#   lio_portal_add IQN TPGT ADDR [PORT]
#   lio_lun_add IQN TPGT LUN BACKSTORE
#   lio_chap IQN TPGT USER PASSWORD
#   lio_tpg_enable IQN TPGT / lio_tpg_disable IQN TPGT
#   lio_teardown_all
# iSCSI host (open-iscsi):
#   iscsi_host_start
#   iscsi_discover ADDR[:PORT]
#   iscsi_node_set IQN PORTAL KEY VALUE
#   iscsi_login IQN PORTAL / iscsi_logout_all
#   iscsi_session_of IQN PORTAL -> prints sessionN
#   iscsi_wait_state SESSION STATE [SECONDS]
# NQN alias (a second target sharing an NQN, see hack/lab/nqnproxy):
#   nqnproxy_start LISTEN CONNECT HOST_NQN TARGET_NQN [HOLD_FILE] / nqnproxy_stop_all
# Stuck iSCSI session (open-iscsi #387, see hack/lab/flakyproxy):
#   flakyproxy_start LISTEN CONNECT / flakyproxy_stop
#   iscsid_foreground (iscsid with its log kept; $ISCSID_RESTART restarts it)
#   iscsi_make_stuck SESSION -> 0 when the session is stuck
# Faults:
#   fault_drop_port TRSVCID [ADDR] / fault_restore_port TRSVCID [ADDR]
#   fault_clear
# Misc:
#   lab_loop_create NAME SIZE_MB -> prints /dev/loopN
#   lab_wait SECONDS DESCRIPTION COMMAND...
#   multipathd_start
#   lab_teardown_all

LAB_CFS=/sys/kernel/config
NVMET=$LAB_CFS/nvmet
LIO=$LAB_CFS/target
LAB_BACKING=${LAB_BACKING:-/tmp/lab-backing}

lab_log() { printf '[%7s] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*" >&2; }
lab_fail() {
	printf 'targets.sh: %s\n' "$*" >&2
	return 1
}

# lab_wait SECONDS DESCRIPTION COMMAND... polls COMMAND every 0.2s until
# it succeeds; after SECONDS it fails naming DESCRIPTION.
lab_wait() {
	local secs=$1 what=$2 deadline
	shift 2
	deadline=$(($(date +%s%N) + secs * 1000000000))
	until "$@" >/dev/null 2>&1; do
		if [ "$(date +%s%N)" -ge "$deadline" ]; then
			lab_fail "timed out after ${secs}s waiting for $what"
			return 1
		fi
		sleep 0.2
	done
}

# lab_loop_create NAME SIZE_MB makes a sparse backing file and prints the
# loop device attached to it.
lab_loop_create() {
	local name=$1 size=$2 img
	modprobe loop || return
	mkdir -p "$LAB_BACKING"
	img=$LAB_BACKING/$name.img
	truncate -s "${size}M" "$img" || return
	losetup --find --show "$img"
}

lab_loop_destroy_all() {
	local img
	for img in "$LAB_BACKING"/*.img; do
		[ -e "$img" ] || continue
		losetup -j "$img" | cut -d: -f1 | while read -r dev; do losetup -d "$dev"; done
		rm -f "$img"
	done
}

# ---------------------------------------------------------------- nvmet

nvmet_init() {
	modprobe nvmet && modprobe nvmet_tcp && [ -d "$NVMET" ] || lab_fail "nvmet configfs not available"
}

# nvmet_subsys_create NQN [CNTLID_MIN CNTLID_MAX]: a subsystem any host
# may connect to, optionally restricted to a controller ID range (two
# targets that share an NQN must hand out disjoint controller IDs).
nvmet_subsys_create() {
	local nqn=$1 min=${2:-} max=${3:-} d
	nvmet_init || return
	d=$NVMET/subsystems/$nqn
	mkdir "$d" || return
	echo 1 >"$d/attr_allow_any_host" || return
	echo "pathmend-lab" >"$d/attr_model" 2>/dev/null || true
	# nvmet picks a random serial; derive it from the NQN so recaptures
	# of a scenario differ only where the kernel state does.
	printf '%s' "$nqn" | md5sum | cut -c1-20 >"$d/attr_serial" || return
	if [ -n "$min" ]; then
		echo "$min" >"$d/attr_cntlid_min" || return
		echo "$max" >"$d/attr_cntlid_max" || return
	fi
}

# nvmet_ns_add NQN NSID DEVICE [ANA_GROUP [UUID]] adds and enables a
# namespace backed by DEVICE (a loop device).
nvmet_ns_add() {
	local nqn=$1 nsid=$2 dev=$3 grp=${4:-1} uuid=${5:-} d
	d=$NVMET/subsystems/$nqn/namespaces/$nsid
	mkdir "$d" || return
	echo -n "$dev" >"$d/device_path" || return
	echo "$grp" >"$d/ana_grpid" || return
	if [ -n "$uuid" ]; then
		echo "$uuid" >"$d/device_uuid" || return
	fi
	echo 1 >"$d/enable" || lab_fail "enable namespace $nsid of $nqn"
}

nvmet_ns_enable() { echo 1 >"$NVMET/subsystems/$1/namespaces/$2/enable"; }
nvmet_ns_disable() { echo 0 >"$NVMET/subsystems/$1/namespaces/$2/enable"; }

# nvmet_port_create PORT_ID TRADDR TRSVCID: a TCP/IPv4 port.
nvmet_port_create() {
	local id=$1 addr=$2 svc=$3 d
	nvmet_init || return
	d=$NVMET/ports/$id
	mkdir "$d" || return
	echo tcp >"$d/addr_trtype" &&
		echo ipv4 >"$d/addr_adrfam" &&
		echo "$addr" >"$d/addr_traddr" &&
		echo "$svc" >"$d/addr_trsvcid"
}

nvmet_port_link() { ln -s "$NVMET/subsystems/$2" "$NVMET/ports/$1/subsystems/$2"; }
nvmet_port_unlink() { rm "$NVMET/ports/$1/subsystems/$2"; }

# nvmet_port_ana PORT_ID GROUP STATE sets an ANA group's state on a port,
# creating the group if needed (group 1 always exists).
nvmet_port_ana() {
	local id=$1 grp=$2 state=$3 d
	d=$NVMET/ports/$id/ana_groups/$grp
	[ -d "$d" ] || mkdir "$d" || return
	echo "$state" >"$d/ana_state"
}

nvmet_teardown_all() {
	local p s g n
	[ -d "$NVMET" ] || return 0
	for p in "$NVMET"/ports/*; do
		[ -d "$p" ] || continue
		for s in "$p"/subsystems/*; do [ -L "$s" ] && rm "$s"; done
		for g in "$p"/ana_groups/*; do
			[ "$(basename "$g")" = 1 ] || rmdir "$g" 2>/dev/null || true
		done
		rmdir "$p"
	done
	for s in "$NVMET"/subsystems/*; do
		[ -d "$s" ] || continue
		for n in "$s"/namespaces/*; do
			[ -d "$n" ] || continue
			echo 0 >"$n/enable"
			rmdir "$n"
		done
		rmdir "$s"
	done
}

# ---------------------------------------------------------------- NVMe host

# nvme_host_connect NQN TRADDR TRSVCID [OPTIONS] connects the way pathmend
# does: one write of an option string to /dev/nvme-fabrics, then a read of
# "instance=N,cntlid=M" from the same open file. Prints nvmeN.
nvme_host_connect() {
	local nqn=$1 addr=$2 svc=$3 extra=${4:-} opts fd resp
	modprobe nvme_tcp || return
	opts="transport=tcp,traddr=$addr,trsvcid=$svc,nqn=$nqn"
	opts+=",hostnqn=$(cat /etc/nvme/hostnqn),hostid=$(cat /etc/nvme/hostid)"
	[ -n "$extra" ] && opts+=",$extra"
	exec {fd}<>/dev/nvme-fabrics || return
	if ! printf '%s' "$opts" >&"$fd"; then
		exec {fd}>&-
		lab_fail "connect $nqn at $addr:$svc refused by the kernel"
		return 1
	fi
	IFS= read -r resp <&"$fd"
	exec {fd}>&-
	case $resp in
	instance=*) resp=${resp#instance=} && echo "nvme${resp%%,*}" ;;
	*) lab_fail "connect $nqn at $addr:$svc: unexpected answer '$resp'" ;;
	esac
}

nvme_host_delete() { echo 1 >"/sys/class/nvme/$1/delete_controller"; }

nvme_host_delete_all() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/delete_controller" ] && echo 1 >"$c/delete_controller" 2>/dev/null || true
	done
	lab_wait 60 "all NVMe controllers gone" nvme_none_left
}
nvme_none_left() { ! ls /sys/class/nvme/nvme* >/dev/null 2>&1; }

nvme_state_is() { [ "$(cat "/sys/class/nvme/$1/state" 2>/dev/null)" = "$2" ]; }
nvme_wait_state() { lab_wait "${3:-60}" "$1 to be $2" nvme_state_is "$1" "$2"; }

# ---------------------------------------------------------------- LIO

lio_init() {
	modprobe target_core_mod && modprobe target_core_iblock && modprobe iscsi_target_mod || return
	[ -d "$LIO/iscsi" ] || mkdir "$LIO/iscsi" || lab_fail "LIO iSCSI fabric not available"
}

# lio_backstore_iblock NAME DEVICE: an iblock backstore (iblock_0/NAME).
lio_backstore_iblock() {
	local name=$1 dev=$2 d
	lio_init || return
	d=$LIO/core/iblock_0/$name
	mkdir -p "$d" || return
	echo "udev_path=$dev" >"$d/control" || return
	echo 1 >"$d/enable" || return
	# LIO generates no unit serial by itself (targetcli does); without one
	# the LUN has no VPD 0x83 identifier and multipath no WWID. Derive it
	# from the name so recaptures are stable.
	printf '%s' "$(lab_uuid_of "$name")" >"$d/wwn/vpd_unit_serial"
}

# lab_uuid_of TEXT prints a UUID-shaped string derived from TEXT.
lab_uuid_of() {
	local h
	h=$(printf '%s' "$1" | md5sum | cut -c1-32)
	echo "${h:0:8}-${h:8:4}-4${h:13:3}-8${h:17:3}-${h:20:12}"
}

# lio_target_create IQN TPGT: a target with one TPG in demo mode (any
# initiator, no ACLs, no authentication until lio_chap).
lio_target_create() {
	local iqn=$1 tpgt=$2 t
	lio_init || return
	t=$LIO/iscsi/$iqn/tpgt_$tpgt
	mkdir -p "$t" || return
	echo 1 >"$t/attrib/generate_node_acls" &&
		echo 1 >"$t/attrib/cache_dynamic_acls" &&
		echo 0 >"$t/attrib/demo_mode_write_protect" &&
		echo 0 >"$t/attrib/authentication"
}

lio_portal_add() { mkdir "$LIO/iscsi/$1/tpgt_$2/np/$3:${4:-3260}"; }
lio_portal_remove() { rmdir "$LIO/iscsi/$1/tpgt_$2/np/$3:${4:-3260}"; }

# lio_lun_add IQN TPGT LUN BACKSTORE exports iblock_0/BACKSTORE as LUN.
lio_lun_add() {
	local l=$LIO/iscsi/$1/tpgt_$2/lun/lun_$3
	mkdir "$l" && ln -s "$LIO/core/iblock_0/$4" "$l/$4"
}

# lio_chap IQN TPGT USER PASSWORD requires one-way CHAP for the TPG's
# demo-mode sessions.
lio_chap() {
	local t=$LIO/iscsi/$1/tpgt_$2
	# No trailing newline: LIO stores these strings verbatim.
	printf '%s' "$3" >"$t/auth/userid" &&
		printf '%s' "$4" >"$t/auth/password" &&
		echo 1 >"$t/attrib/authentication"
}

lio_tpg_enable() { echo 1 >"$LIO/iscsi/$1/tpgt_$2/enable"; }
lio_tpg_disable() { echo 0 >"$LIO/iscsi/$1/tpgt_$2/enable"; }

lio_teardown_all() {
	local t g l x
	[ -d "$LIO/iscsi" ] || return 0
	for t in "$LIO"/iscsi/iqn.* "$LIO"/iscsi/eui.* "$LIO"/iscsi/naa.*; do
		[ -d "$t" ] || continue
		for g in "$t"/tpgt_*; do
			[ -d "$g" ] || continue
			echo 0 >"$g/enable" 2>/dev/null || true
			for l in "$g"/lun/lun_*; do
				[ -d "$l" ] || continue
				for x in "$l"/*; do [ -L "$x" ] && rm "$x"; done
				rmdir "$l"
			done
			for x in "$g"/np/*; do [ -d "$x" ] && rmdir "$x"; done
			for x in "$g"/acls/*; do [ -d "$x" ] && rmdir "$x"; done
			rmdir "$g"
		done
		rmdir "$t"
	done
	for x in "$LIO"/core/iblock_*/*; do [ -d "$x" ] && rmdir "$x"; done
	for x in "$LIO"/core/iblock_*; do [ -d "$x" ] && rmdir "$x"; done
	return 0
}

# ---------------------------------------------------------------- iSCSI host

iscsi_host_start() {
	modprobe iscsi_tcp || return
	mkdir -p /run/lock/iscsi
	pgrep -x iscsid >/dev/null && return 0
	iscsid || return
	lab_wait 60 "iscsid" test -S /run/iscsid.sock -o -n "$(pgrep -x iscsid)"
}

iscsi_discover() { timeout 30 iscsiadm -m discovery -t sendtargets -p "$1"; }
iscsi_node_set() { iscsiadm -m node -T "$1" -p "$2" -o update -n "$3" -v "$4"; }
iscsi_login() { timeout 60 iscsiadm -m node -T "$1" -p "$2" --login; }

iscsi_logout_all() {
	timeout 60 iscsiadm -m node --logoutall=all >/dev/null 2>&1 || true
	iscsiadm -m node -o delete >/dev/null 2>&1 || true
	iscsiadm -m discoverydb -t sendtargets -o delete >/dev/null 2>&1 || true
	return 0
}

# iscsi_session_of IQN ADDR[:PORT] prints the sysfs session name (sessionN)
# of the session to IQN through that portal.
iscsi_session_of() {
	local iqn=$1 addr=${2%:*} port=${2##*:} s n c
	[ "$port" = "$2" ] && port=3260
	for s in /sys/class/iscsi_session/session*; do
		[ "$(cat "$s/targetname")" = "$iqn" ] || continue
		n=${s##*session}
		for c in /sys/class/iscsi_connection/connection"$n":*; do
			if [ "$(cat "$c/persistent_address")" = "$addr" ] && [ "$(cat "$c/persistent_port")" = "$port" ]; then
				basename "$s"
				return 0
			fi
		done
	done
	return 1
}

iscsi_state_is() { [ "$(cat "/sys/class/iscsi_session/$1/state" 2>/dev/null)" = "$2" ]; }
iscsi_wait_state() { lab_wait "${3:-180}" "$1 to be $2" iscsi_state_is "$1" "$2"; }

# iscsi_disks_of SESSION prints the sdX devices of a session's LUNs.
iscsi_disks_of() {
	local d
	for d in /sys/class/iscsi_session/"$1"/device/target*/*:*:*:*/block/*; do
		[ -e "$d" ] && basename "$d"
	done
}

multipathd_start() {
	modprobe dm_multipath && modprobe dm_round_robin && modprobe dm_service_time && modprobe scsi_dh_alua || return
	pgrep -x multipathd >/dev/null || multipathd || return
	lab_wait 60 "multipathd to answer" multipathd show daemon
}

multipathd_stop() {
	pgrep -x multipathd >/dev/null || return 0
	multipathd shutdown >/dev/null 2>&1 || true
	lab_wait 60 "multipathd to stop" sh -c '! pgrep -x multipathd'
	multipath -F >/dev/null 2>&1 || true
	return 0
}

# ---------------------------------------------------------------- NQN alias

# nqnproxy_start LISTEN CONNECT HOST_NQN TARGET_NQN [HOLD_FILE] runs
# nqnproxy in the background: the subsystem TARGET_NQN, reached through
# LISTEN, answers as HOST_NQN (a second target sharing HOST_NQN; the same
# NQN twice for a plain proxy). With HOLD_FILE, the target's asynchronous
# events are held back while that file exists. nqnproxy_stop_all ends them.
nqnproxy_start() {
	local log hold=()
	mkdir -p /run/lab
	log=/run/lab/nqnproxy-${1//[:.]/_}.log
	[ -n "${5:-}" ] && hold=(-hold-aen-file "$5")
	"${LAB_BIN:-/lab/bin}/nqnproxy" -listen "$1" -connect "$2" -host-nqn "$3" -target-nqn "$4" "${hold[@]}" \
		</dev/null >"$log" 2>&1 &
	echo $! >>/run/lab/nqnproxy.pids
	lab_wait 60 "nqnproxy on $1" grep -q 'nqnproxy:' "$log"
}

nqnproxy_stop_all() {
	local pid
	[ -f /run/lab/nqnproxy.pids ] || return 0
	while read -r pid; do kill "$pid" 2>/dev/null; done </run/lab/nqnproxy.pids
	rm -f /run/lab/nqnproxy.pids
	return 0
}

# ---------------------------------------------------------------- stuck iSCSI session

# The stuck state of open-iscsi #387 (iscsid 2.1.8 on Linux 6.1): a
# connection reset after iscsid bound a reopened connection and before its
# login makes the kernel refuse every later bind with ENOTCONN; iscsid
# logs "can't bind conn N:0 to session N, retcode -107" every few seconds
# forever while the portal is reachable. hack/lab/flakyproxy, a portal in
# front of a LIO portal, lands such a reset.
LAB_RUN_DIR=/run/lab
FLAKY_LOG=$LAB_RUN_DIR/flakyproxy.log
ISCSID_LOG=$LAB_RUN_DIR/iscsid.log
ISCSID_RESTART=$LAB_RUN_DIR/restart-iscsid.sh

# lab_say is how iscsi_make_stuck reports progress; a script may redefine it.
lab_say() { lab_log "$@"; }

# flakyproxy_start LISTEN CONNECT runs flakyproxy in the background, one
# line per event in $FLAKY_LOG; flakyproxy_stop ends it.
flakyproxy_start() {
	mkdir -p "$LAB_RUN_DIR"
	: >"$LAB_RUN_DIR/flakyproxy.watch"
	"${LAB_BIN:-/lab/bin}/flakyproxy" -listen "$1" -connect "$2" -watch-file "$LAB_RUN_DIR/flakyproxy.watch" \
		</dev/null >"$FLAKY_LOG" 2>&1 &
	echo $! >"$LAB_RUN_DIR/flakyproxy.pid"
	lab_wait 60 "flakyproxy on $1" grep -q '^listening' "$FLAKY_LOG"
}

flakyproxy_stop() {
	[ -f "$LAB_RUN_DIR/flakyproxy.pid" ] || return 0
	kill "$(cat "$LAB_RUN_DIR/flakyproxy.pid")" 2>/dev/null
	rm -f "$LAB_RUN_DIR/flakyproxy.pid"
	return 0
}

flaky_resets() { awk '/^reset/ { n++ } END { print n + 0 }' "$FLAKY_LOG"; }
flaky_bound_resets() { awk '/^reset bound/ { n++ } END { print n + 0 }' "$FLAKY_LOG"; }
# flaky_unbound_run: resets never seen bound since the latest one seen bound.
flaky_unbound_run() { awk '/^reset bound/ { n = 0; b = 1; next } /^reset$/ { if (b) n++ } END { print n + 0 }' "$FLAKY_LOG"; }
# flaky_fwd_bound / flaky_fwd_unbound: forwarded connections seen bound,
# and closed by iscsid before they ever were (its bind failed).
flaky_fwd_bound() { grep -c '^forward bound$' "$FLAKY_LOG" || true; }
flaky_fwd_unbound() { grep -c '^forward closed unbound$' "$FLAKY_LOG" || true; }

# iscsid_foreground (re)starts iscsid in the foreground with its log
# appended to $ISCSID_LOG. It writes and runs $ISCSID_RESTART, which does
# the same and serves as pathmend's --iscsid-restart-command (the guest
# has no systemd): stop iscsid by its pid, start it again. Sessions stay.
iscsid_foreground() {
	mkdir -p "$LAB_RUN_DIR" /run/lock/iscsi
	modprobe iscsi_tcp || return
	cat >"$ISCSID_RESTART" <<EOF
pid=\$(pgrep -x iscsid)
[ -n "\$pid" ] && kill \$pid
for i in \$(seq 100); do pgrep -x iscsid >/dev/null || break; sleep 0.1; done
setsid iscsid -f >>"$ISCSID_LOG" 2>&1 </dev/null &
for i in \$(seq 100); do pgrep -x iscsid >/dev/null && break; sleep 0.1; done
EOF
	bash "$ISCSID_RESTART"
	pgrep -x iscsid >/dev/null || lab_fail "iscsid did not start"
}

iscsid_cant_bind() { grep -c 'retcode -107' "$ISCSID_LOG" 2>/dev/null || true; }

# iscsi_make_stuck SESSION drives SESSION (logged in through flakyproxy)
# towards the stuck state, once: the proxy breaks until the session
# leaves LOGGED_IN and the stuck state's signature shows (a reopen reset
# after its bind, then three that were never bound: their bind failed) or
# for 2 min, then passes, and the attempt is decided as soon as the race
# is known: lost (1) when a reopen is seen bound or the session is
# LOGGED_IN again (iscsid is recovering it by itself), won (0) when two
# reopens are closed without ever being bound while the session stays
# down, or when it is still down 15 s later (iscsid relogs in within
# 2-6 s otherwise). A lost attempt leaves the session recovering; the
# next attempt may break it again at once.
iscsi_make_stuck() {
	local s=$1 t0 i r0 b0 fb0 fu0 tp
	echo "/sys/class/iscsi_connection/connection${s#session}:0/state" >"$LAB_RUN_DIR/flakyproxy.watch"
	t0=$(cut -d' ' -f1 /proc/uptime)
	lab_say "proxy breaking: resetting the session's connection and every reopen once it is bound"
	kill -USR1 "$(cat "$LAB_RUN_DIR/flakyproxy.pid")"
	lab_wait 90 "$s to leave LOGGED_IN" sh -c "[ \"\$(cat /sys/class/iscsi_session/$s/state)\" != LOGGED_IN ]" ||
		return 1
	lab_say "$s $(cat "/sys/class/iscsi_session/$s/state") ($(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}') s after the break)"
	r0=$(flaky_resets) b0=$(flaky_bound_resets)
	for ((i = 0; i < 600; i++)); do
		[ "$(flaky_bound_resets)" -gt "$b0" ] && [ "$(flaky_unbound_run)" -ge 3 ] && break
		sleep 0.2
	done
	fb0=$(flaky_fwd_bound) fu0=$(flaky_fwd_unbound)
	kill -USR2 "$(cat "$LAB_RUN_DIR/flakyproxy.pid")"
	tp=$(cut -d' ' -f1 /proc/uptime)
	lab_say "proxy passing again after $(($(flaky_resets) - r0)) resets: $(($(flaky_bound_resets) - b0)) after the bind, then $(flaky_unbound_run) reopens never bound; $s $(cat "/sys/class/iscsi_session/$s/state")"
	for ((i = 1; i <= 75; i++)); do
		sleep 0.2
		if [ "$(cat "/sys/class/iscsi_session/$s/state" 2>/dev/null)" = LOGGED_IN ]; then
			lab_say "iscsid relogged $s in by itself $(awk -v a="$tp" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}') s after the proxy passed: not stuck"
			return 1
		fi
		if [ "$(flaky_fwd_bound)" -gt "$fb0" ]; then
			lab_say "a reopen of $s was bound $(awk -v a="$tp" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}') s after the proxy passed: iscsid is logging in, not stuck"
			return 1
		fi
		if [ $(($(flaky_fwd_unbound) - fu0)) -ge 2 ]; then
			lab_say "$s still $(cat "/sys/class/iscsi_session/$s/state"): $(($(flaky_fwd_unbound) - fu0)) reopens after its portal passed were closed without a bind: stuck"
			break
		fi
	done
	[ "$i" -gt 75 ] && lab_say "$s still $(cat "/sys/class/iscsi_session/$s/state") 15 s after its portal passes again: stuck (iscsid relogs in within 2-6 s otherwise)"
	[ -s "$ISCSID_LOG" ] && lab_say "iscsid's log: $(iscsid_cant_bind) x \"$(grep 'retcode -107' "$ISCSID_LOG" | tail -n 1 | sed 's/^iscsid: //')\""
	return 0
}

# ---------------------------------------------------------------- faults

# fault_drop_port TRSVCID [ADDR] silently drops every packet to a target
# port (optionally only on one address): the host sees a dead path, not a
# refused one.
fault_drop_port() {
	local a=()
	[ -n "${2:-}" ] && a=(-d "$2")
	iptables -I INPUT -p tcp --dport "$1" "${a[@]}" -j DROP
}

fault_restore_port() {
	local a=()
	[ -n "${2:-}" ] && a=(-d "$2")
	iptables -D INPUT -p tcp --dport "$1" "${a[@]}" -j DROP
}

fault_clear() { iptables -F INPUT 2>/dev/null || true; }

# lab_teardown_all undoes everything the helpers can create, host side
# first, so the next scenario starts from an empty node.
lab_teardown_all() {
	fault_clear || true
	multipathd_stop || true
	iscsi_logout_all || true
	nvme_host_delete_all || true
	nqnproxy_stop_all || true
	flakyproxy_stop || true
	lio_teardown_all || true
	nvmet_teardown_all || true
	lab_loop_destroy_all || true
	return 0
}
