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
	local mode=${1:-job} img k8s share rc=0 t
	"$GO" version >/dev/null || lab_die "no usable go (GO=$GO)"
	lab_host_packages "${LAB_HOST_PACKAGES[@]}"
	img=$("$KLAB_DIR/image.sh")
	k8s=$("$KLAB_DIR/build.sh")

	share=$LAB_OUT/kubelet
	rm -rf "$share"
	mkdir -p "$share/bin" "$share/out" "$share/deploy"
	cp -r "$LAB_DIR/guest" "$share/guest"
	cp "$KLAB_DIR"/guest/*.sh "$share/guest/"
	cp -r "$REPO_ROOT/deploy/base" "$REPO_ROOT/deploy/examples" "$share/deploy/"

	lab_step "Testing and building the lab programs (pathmend, flakyproxy, pause, ociimage; kubelab, labregistrar)"
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

	if [ "$mode" = shell ]; then
		LAB_BOOT_TIMEOUT=${LAB_BOOT_TIMEOUT:-14400} "$LAB_DIR/boot.sh" --shell --mem "${LAB_MEM:-4096}" --image "$img" "$share"
		return
	fi
	echo 'exec bash /lab/guest/kubelet_lab.sh' >"$share/job.sh"
	"$LAB_DIR/boot.sh" --mem "${LAB_MEM:-4096}" --timeout "${LAB_BOOT_TIMEOUT:-3600}" --image "$img" "$share" || rc=$?
	if [ $rc -ne 0 ]; then
		lab_step "Kubelet lab FAILED (exit $rc); logs in $share/out/"
		return $rc
	fi
	lab_step "Kubelet lab passed; report: $share/out/kubelet-lab.md, logs in $share/out/"
}

main "$@"
