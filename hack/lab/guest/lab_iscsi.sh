#!/bin/bash
# pathmend lab: the iSCSI session heal, live (a section of `make lab`).
#
#   bash /lab/guest/lab_iscsi.sh
#
# Builds a LIO target with one LUN on 127.0.0.1:3260 and 127.0.0.2:3260,
# puts a flaky proxy (hack/lab/flakyproxy: SIGUSR1 breaks, SIGUSR2
# passes) on 127.0.0.3:3260 in front of the second portal, logs
# in through 127.0.0.1 and the proxy (one dm-multipath map, two paths),
# and drives the proxied session into the stuck state of open-iscsi #387
# the way e2e/iscsi_heal_test.go does: the proxy resets every reopen
# attempt as soon as the kernel shows the connection "bound", then lets
# traffic pass again. If iscsid has not relogged the session in 15 s
# later, it is stuck (iscsid's own log, kept here, says why: "can't bind
# conn … retcode -107" every few seconds); pathmend serve (heal=repair,
# stuck threshold 10 s, 1 s ticks, heal scope all: the sessions are
# logged in here, not staged) is started and the session state and
# pathmend's verdict lines are printed as it kicks and the session comes
# back. Reaching the stuck state is a race (the Go proxy wins it almost
# every time): when iscsid recovers by itself in all 5 attempts, that is
# said and the section ends without failing. A stuck session pathmend
# does not bring back fails the section, and `make lab` with it.
set -uo pipefail
LAB=${LAB:-/lab}
export LAB_BIN=$LAB/bin
# shellcheck source=targets.sh
. "$LAB/guest/targets.sh"

IQN=iqn.2024-01.io.pathmend.lab:heal
PROXY=127.0.0.3:3260
PMLOG=$LAB/out/pathmend-iscsi.log
PM=

up() { cut -d' ' -f1 /proc/uptime; }
step() { printf '\n==> [guest %6ss] %s\n' "$(up)" "$*"; }
say() { printf '    [guest %6ss] %s\n' "$(up)" "$*"; }
state_of() { cat "/sys/class/iscsi_session/$1/state" 2>/dev/null || echo absent; }
lab_say() { say "$@"; }
verdicts() { grep -E '"iSCSI session verdict"|"Kicking iSCSI session"|"Restarting iscsid' "$PMLOG" 2>/dev/null | sed 's/^/    pathmend: /'; }

cleanup() {
	[ -n "$PM" ] && kill -TERM "$PM" 2>/dev/null && wait "$PM" 2>/dev/null
	lab_teardown_all
}
trap cleanup EXIT

step "iSCSI heal: a LIO target $IQN with 1 LUN on 127.0.0.1:3260 and 127.0.0.2:3260, a flaky proxy on $PROXY in front of 127.0.0.2:3260"
lab_teardown_all
lio_target_create "$IQN" 1 || exit 1
dev=$(lab_loop_create heal-lun0 64) && lio_backstore_iblock heal-lun0 "$dev" && lio_lun_add "$IQN" 1 0 heal-lun0 &&
	lio_portal_add "$IQN" 1 127.0.0.1 && lio_portal_add "$IQN" 1 127.0.0.2 && lio_tpg_enable "$IQN" 1 || exit 1
flakyproxy_start "$PROXY" 127.0.0.2:3260 || exit 1
# iscsid in the foreground, its log kept: its "can't bind conn … retcode
# -107" lines are the stuck state's own proof. $ISCSID_RESTART is the
# heal's restart rung (not expected here: the map has a live second path,
# so the kick is a logout + login).
iscsid_foreground && multipathd_start || exit 1
for p in 127.0.0.1:3260 "$PROXY"; do
	iscsiadm -m node -T "$IQN" -p "$p" -o new >/dev/null && iscsi_node_set "$IQN" "$p" node.startup manual &&
		iscsi_login "$IQN" "$p" >/dev/null || exit 1
done
lab_wait 30 "the multipath map" sh -c 'ls /sys/block/dm-*/slaves/* >/dev/null 2>&1' || exit 1
lab_wait 30 "two paths in the map" sh -c '[ "$(ls /sys/block/dm-*/slaves | wc -l)" -ge 2 ]' || exit 1
s=$(iscsi_session_of "$IQN" "$PROXY")
say "sessions: $(iscsi_session_of "$IQN" 127.0.0.1:3260) through 127.0.0.1:3260, $s through $PROXY; map $(ls -d /sys/block/dm-* | xargs -n1 basename) over $(ls /sys/block/dm-*/slaves | xargs)"

step "Driving $s into the stuck state (open-iscsi #387: a reset between the connection bind and the login)"
# A lost attempt ends as soon as it is known lost and the next breaks the
# session again at once; 5 attempts fit in a few minutes.
stuck=
for attempt in 1 2 3 4 5; do
	if iscsi_make_stuck "$s"; then
		stuck=1
		break
	fi
	say "attempt $attempt: not stuck"
done
if [ -z "$stuck" ]; then
	step "Could not reproduce the stuck state in 5 attempts (the window is a race): skipping the heal demonstration"
	exit 0
fi

step "Starting pathmend serve (heal=repair, --iscsi-stuck-threshold=10s, --monitor-interval=1s, --heal-iscsi-scope=all); its clocks start at its first look"
mkdir -p /run/pathmend-iscsi/state
n107=$(iscsid_cant_bind)
"$LAB_BIN/pathmend" serve --endpoint unix:///run/pathmend-iscsi/csi.sock --node-id pathmend-lab \
	--sys-root /sys --dev-root /dev --state-dir /run/pathmend-iscsi/state -v=2 \
	--heal=repair --iscsi-stuck-threshold=10s --monitor-interval=1s --heal-iscsi-scope=all \
	--iscsid-restart-command "bash $ISCSID_RESTART" >"$PMLOG" 2>&1 &
PM=$!
t0=$(up)
back= took= nback=
for ((i = 0; i < 45; i++)); do
	ns=$(iscsi_session_of "$IQN" "$PROXY" 2>/dev/null) || ns=
	say "session through $PROXY: ${ns:-none} $([ -n "$ns" ] && state_of "$ns")"
	if [ -n "$ns" ] && [ "$(state_of "$ns")" = LOGGED_IN ]; then
		back=$ns took=$(awk -v a="$t0" -v b="$(up)" 'BEGIN{printf "%.1f", b-a}') nback=$(iscsid_cant_bind)
		break
	fi
	sleep 1
done
lab_wait 30 "two paths in the map" sh -c '[ "$(ls /sys/block/dm-*/slaves | wc -l)" -ge 2 ]' || true
# The verdict follows the kick once pathmend has seen the node record
# LOGGED_IN again (its next tick).
lab_wait 20 "pathmend's verdict on the kick" grep -qE 'verdict="(repaired|failed)"' "$PMLOG" || true
step "pathmend's verdict lines"
verdicts
if [ -z "$back" ]; then
	step "FAILED: the session through $PROXY is not LOGGED_IN 45 s after pathmend started; the proxy forwarded $(grep -c '^forward$' "$FLAKY_LOG") connections in all, last lines of its log: $(tail -n 3 "$FLAKY_LOG" | xargs); iscsid's last lines:"
	tail -n 5 "$ISCSID_LOG" | sed 's/^/    /'
	exit 1
fi
step "$back LOGGED_IN ${took} s after pathmend started (was $s, stuck); paths in the map: $(ls /sys/block/dm-*/slaves | xargs); iscsid logged $((nback - n107)) more \"can't bind\" lines while pathmend's clock ran, $(($(iscsid_cant_bind) - nback)) since LOGGED_IN"
