#!/usr/bin/env bash
# pathmend under a real kubelet: host-side entry point of `make kubelet-lab`
# (hack/lab/kubelet/README.md).
#
#   run.sh            build what is missing, boot the guest, run the scenario
#   run.sh shell      the same guest with an interactive shell instead
#
# 1. the guest image: the lab's image plus containerd, runc and etcd
#    (image.sh, cached);
# 2. kubelet and kube-apiserver built from their modules (build.sh, cached);
# 3. pathmend, flakyproxy, the pause program, and the lab's Kubernetes-side
#    programs (k8s/cmd: kubelab, labregistrar), after their unit tests;
# 4. the pod images, packed from busybox-static and the pause program
#    (ociimage);
# 5. one boot (LAB_MEM, default 4096 MiB) that runs guest/kubelet_lab.sh.
#
# Hold the lab lock: the Kubernetes build and qemu each take both cores.
#   flock /tmp/pathmend-lab.lock make kubelet-lab
set -euo pipefail
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

KLAB_DIR=$LAB_DIR/kubelet
# The go that builds pathmend builds the Kubernetes module too (build.sh).
export GO=${GO:-$REPO_ROOT/hack/go}

go_build() { # DIR OUT PKG
	(cd "$1" && CGO_ENABLED=0 timeout 900 "$GO" build -trimpath -o "$2" "$3")
}

# The run's timing, recorded as hack/lab/run.sh records its runs: one line
# in $LAB_OUT/timings.tsv (make lab-timings copies it into
# hack/lab/timings/runs.tsv). T0 is this command's own start (LAB_T0 may
# be an enclosing command's: hack/lab/underload.sh).
T0=$(date +%s.%N)
T_BUILD=0
T_GUEST=0
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
LOAD_SAMPLES=$(mktemp)
(while :; do cut -d' ' -f1 /proc/loadavg; sleep 10; done) >"$LOAD_SAMPLES" 2>/dev/null &
LOAD_PID=$!
trap 'kill "$LOAD_PID" 2>/dev/null; rm -f "$LOAD_SAMPLES"' EXIT

# built_now DIR says "built" when DIR's info was written during this run,
# else "cached".
built_now() {
	local m
	m=$(stat -c %Y "$1/info" 2>/dev/null) || m=0
	if [ "$m" -ge "${T0%.*}" ]; then echo built; else echo cached; fi
}

# record RESULT REPORT IMAGE appends this run to $LAB_OUT/timings.tsv in
# hack/lab/run.sh's columns: the three longest steps of the kubelet lab's
# report stand where an e2e run has its slowest tests, its "Retries: N"
# and closest wait (1/N of its limit) where an e2e run has its own.
record() {
	local result=$1 report=$2 image=$3 load steps retries ratio gocache kernel
	load=$(awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n; else printf "-" }' "$LOAD_SAMPLES" 2>/dev/null) || load=-
	[ "${LAB_BURNERS:-0}" -gt 0 ] && load="$load, $LAB_BURNERS burners"
	steps=$(awk -F'|' 'NF >= 5 && $3 ~ /^ *[0-9.]+ *$/ && $2 !~ /total/ {
		n = $2; gsub(/^ +| +$/, "", n); gsub(/[,=\t]/, ";", n); n = substr(n, 1, 60)
		s = $3; gsub(/ /, "", s); printf "%s\t%s\n", s, n }' "$report" 2>/dev/null |
		sort -rn | head -n 3 | awk -F'\t' '{ printf "%s%s=%s", (NR > 1 ? "," : ""), $2, $1 }')
	retries=$(sed -n 's/^Retries: \([0-9]*\).*/\1/p' "$report" 2>/dev/null | head -n 1)
	ratio=$(sed -n 's/^Closest wait: .*(1\/\([0-9.]*\))\.$/\1/p' "$report" 2>/dev/null | head -n 1)
	gocache=$GOCACHE_STATE
	kernel=$(awk -F= '/^base=/ { print $2 }' "$IMG/info" 2>/dev/null)
	kernel=$(awk -F= '/^kernel_release=/ { print $2 }' "$kernel/info" 2>/dev/null)
	mkdir -p "$LAB_OUT"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
		"$(date -u +%Y-%m-%dT%H:%M:%SZ)" kubelet-lab - "$image" "$gocache" "$T_BUILD" "$T_GUEST" "$(secs "$T0" "$(now)")" \
		"$result" - "${steps:--}" "$kernel" "$(nproc)" "$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)GiB" \
		"$load" "${retries:--}" "${ratio:--}" >>"$LAB_OUT/timings.tsv"
	lab_step "Timing recorded in $LAB_OUT/timings.tsv: total $(secs "$T0" "$(now)")s (image $image, builds ${T_BUILD}s, guest ${T_GUEST}s, host load $load)"
}

# pack_images SHARE IMAGE_DIR builds the two pod images into SHARE/bin.
pack_images() {
	local share=$1 img=$2 root applet
	root=$(mktemp -d)
	mkdir -p "$root/pause" "$root/busybox/bin" "$root/busybox/tmp"
	chmod 1777 "$root/busybox/tmp"
	cp "$share/bin/pause" "$root/pause/pause"
	cp "$img/busybox" "$root/busybox/bin/busybox"
	for applet in $("$img/busybox" --list); do
		[ "$applet" = busybox ] || ln -s busybox "$root/busybox/bin/$applet"
	done
	"$share/bin/ociimage" -name localhost/pathmend-lab/pause:1 -rootfs "$root/pause" -entrypoint '["/pause"]' -o "$share/bin/pause.tar"
	"$share/bin/ociimage" -name localhost/pathmend-lab/busybox:1 -rootfs "$root/busybox" -entrypoint '["/bin/sh"]' -o "$share/bin/busybox.tar"
	rm -rf "$root"
}

main() {
	local mode=${1:-job} img k8s share rc=0 t t1 image
	"$GO" version >/dev/null || lab_die "no usable go (GO=$GO)"
	lab_host_packages "${LAB_HOST_PACKAGES[@]}"
	GOCACHE_STATE=$(d=$("$GO" env GOCACHE 2>/dev/null) && [ "$(find "$d" -maxdepth 2 -type f 2>/dev/null | head -n 200 | wc -l)" -ge 200 ] && echo warm || echo cold)
	img=$("$KLAB_DIR/image.sh")
	IMG=$img
	k8s=$("$KLAB_DIR/build.sh")
	image="$(built_now "$img") image, $(built_now "$k8s") Kubernetes"

	share=$LAB_OUT/kubelet
	rm -rf "$share"
	mkdir -p "$share/bin" "$share/out" "$share/deploy"
	cp -r "$LAB_DIR/guest" "$share/guest"
	cp "$KLAB_DIR"/guest/*.sh "$share/guest/"
	cp -r "$REPO_ROOT/deploy/base" "$REPO_ROOT/deploy/examples" "$share/deploy/"

	lab_step "Testing and building the lab programs (pathmend, flakyproxy, pause, ociimage; kubelab, labregistrar)"
	t1=$(now)
	(cd "$KLAB_DIR/k8s" && timeout 900 "$GO" vet ./... && timeout 900 "$GO" test -count=1 ./...) >&2
	go_build "$REPO_ROOT" "$REPO_ROOT/bin/pathmend" ./cmd/pathmend
	cp "$REPO_ROOT/bin/pathmend" "$share/bin/pathmend"
	go_build "$REPO_ROOT" "$share/bin/flakyproxy" ./hack/lab/flakyproxy
	go_build "$REPO_ROOT" "$share/bin/pause" ./hack/lab/kubelet/pause
	go_build "$REPO_ROOT" "$share/bin/ociimage" ./hack/lab/kubelet/ociimage
	go_build "$KLAB_DIR/k8s" "$share/bin/kubelab" ./cmd/kubelab
	go_build "$KLAB_DIR/k8s" "$share/bin/labregistrar" ./cmd/labregistrar
	for t in kubelet kube-apiserver; do
		ln "$k8s/$t" "$share/bin/$t" 2>/dev/null || cp "$k8s/$t" "$share/bin/$t"
	done
	lab_step "Packing the pod images (busybox-static, pause) as OCI archives"
	pack_images "$share" "$img"
	T_BUILD=$(secs "$t1" "$(now)")

	if [ "$mode" = shell ]; then
		LAB_BOOT_TIMEOUT=${LAB_BOOT_TIMEOUT:-14400} "$LAB_DIR/boot.sh" --shell --mem "${LAB_MEM:-4096}" --image "$img" "$share"
		return
	fi
	echo 'exec bash /lab/guest/kubelet_lab.sh' >"$share/job.sh"
	t1=$(now)
	"$LAB_DIR/boot.sh" --mem "${LAB_MEM:-4096}" --timeout "${LAB_BOOT_TIMEOUT:-3600}" --image "$img" "$share" || rc=$?
	T_GUEST=$(secs "$t1" "$(now)")
	if [ $rc -ne 0 ]; then
		record fail "$share/out/kubelet-lab.md" "$image"
		lab_step "Kubelet lab FAILED (exit $rc); logs in $share/out/"
		return $rc
	fi
	record pass "$share/out/kubelet-lab.md" "$image"
	lab_step "Kubelet lab passed; report: $share/out/kubelet-lab.md, logs in $share/out/"
}

main "$@"
