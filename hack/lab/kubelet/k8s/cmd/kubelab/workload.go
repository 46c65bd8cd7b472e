package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The workload of every lab pod: a busybox shell loop that writes 256 KiB
// of random data into one of 8 slots of its volume (a file under its own
// directory on a filesystem volume, an offset of a raw block device),
// flushes it (fsync), reads it back with O_DIRECT (from the device, not
// the page cache) and compares SHA-256 sums. Each round prints
// "ok ROUND SUM"; the first failed write, read or comparison prints
// "ERROR …" and ends the container with exit status 1 (the pods never
// restart, so a failure stays visible). SIGTERM ends it with 0.
const workloadScript = `set -u
trap 'echo "stopped after $i rounds"; exit 0' TERM
i=0
if [ -n "${BLOCK_DEVICE:-}" ]; then
	target=$BLOCK_DEVICE
else
	target=/data/$POD_NAME
	mkdir -p "$target" || { echo "ERROR mkdir $target"; exit 1; }
fi
while :; do
	i=$((i + 1))
	slot=$((i % 8))
	dd if=/dev/urandom of=/tmp/block bs=64k count=4 2>/dev/null
	want=$(sha256sum </tmp/block | cut -d' ' -f1)
	if [ -n "${BLOCK_DEVICE:-}" ]; then
		w="dd if=/tmp/block of=$target bs=64k seek=$((slot * 4)) count=4 conv=fsync,notrunc"
		r="dd if=$target bs=64k skip=$((slot * 4)) count=4 iflag=direct"
	else
		w="dd if=/tmp/block of=$target/slot$slot bs=64k count=4 conv=fsync"
		r="dd if=$target/slot$slot bs=64k count=4 iflag=direct"
	fi
	if ! $w 2>/tmp/err; then echo "ERROR round $i: write: $(cat /tmp/err)"; exit 1; fi
	got=$($r 2>/tmp/err | sha256sum | cut -d' ' -f1)
	if [ "$got" != "$want" ]; then echo "ERROR round $i: slot $slot reads back $got, wrote $want: $(cat /tmp/err)"; exit 1; fi
	echo "ok $i $want"
	sleep 1
done
`

const (
	volumeName = "data"
	blockPath  = "/dev/xvda"
)

// writerPod is a pod running the workload on claim: mounted at /data for a
// filesystem claim, as the device blockPath for a block claim. The pod
// names the node (no scheduler runs), uses the host network (no CNI is
// installed) and mounts no service-account token (no token controller
// runs).
func writerPod(name, claim string, block bool) *corev1.Pod {
	c := corev1.Container{
		Name:            "writer",
		Image:           workloadImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         []string{"/bin/sh", "-c", workloadScript},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
	}
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: volumeName, DevicePath: blockPath}}
		c.Env = append(c.Env, corev1.EnvVar{Name: "BLOCK_DEVICE", Value: blockPath})
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: volumeName, MountPath: "/data"}}
	}
	no := false
	grace := int64(5)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloadNamespace, Labels: map[string]string{"app.kubernetes.io/part-of": "pathmend-kubelet-lab"}},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			HostNetwork:                   true,
			AutomountServiceAccountToken:  &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                    []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: volumeName, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// IOReport is what a writer's log says: rounds completed, the last
// round, and every error line.
type IOReport struct {
	Rounds int
	Last   int
	Errors []string
}

// readWriterLog parses the container log kubelet keeps for a pod
// (/var/log/pods/<ns>_<name>_<uid>/writer/*.log, CRI format: "TIME STREAM
// TAG MESSAGE").
func readWriterLog(podsLogDir string, pod *corev1.Pod) (IOReport, error) {
	dir := filepath.Join(podsLogDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), "writer")
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return IOReport{}, err
	}
	if len(files) == 0 {
		return IOReport{}, fmt.Errorf("no container log in %s", dir)
	}
	var r IOReport
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return IOReport{}, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			r.add(criMessage(sc.Text()))
		}
		err = sc.Err()
		fh.Close()
		if err != nil {
			return IOReport{}, err
		}
	}
	return r, nil
}

// criMessage strips the CRI log prefix "TIME STREAM TAG ".
func criMessage(line string) string {
	parts := strings.SplitN(line, " ", 4)
	if len(parts) < 4 {
		return line
	}
	return parts[3]
}

func (r *IOReport) add(msg string) {
	switch {
	case strings.HasPrefix(msg, "ok "):
		f := strings.Fields(msg)
		if len(f) >= 3 {
			if n, err := strconv.Atoi(f[1]); err == nil {
				r.Rounds++
				r.Last = n
			}
		}
	case strings.HasPrefix(msg, "ERROR"):
		r.Errors = append(r.Errors, msg)
	}
}
