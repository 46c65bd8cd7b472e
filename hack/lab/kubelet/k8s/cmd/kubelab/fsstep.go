package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The filesystem-health step: a pod on the NVMe ext4 claim, its
// filesystem made to fail through ext4's own knob
// (/sys/fs/ext4/<dev>/trigger_fs_error; pathmend stages ext4 with
// errors=remount-ro, so every write fails from then on while the mount
// table still says rw). kubelet must show the condition pathmend reports
// — Inaccessible, FilesystemReadOnly — in the pod's status.volumeHealth
// and CSINode's storage health; the pod replaced ("restart the pods"),
// kubelet unstages and stages the volume again, pathmend checks the
// filesystem (fsck -p) before mounting it, and the new pod writes.
// Self-contained: it creates and deletes its own pods on a claim no pod
// holds at its start.
var (
	podFSIdle  = "idle-nvme-fs"
	podFSAfter = "writer-nvme-fs-after"
)

// idlePod is a pod that holds the claim and does no I/O of its own, so
// that it keeps running (and kubelet keeps reporting its volume's health)
// while the filesystem takes no writes.
func idlePod(name, claim string) *corev1.Pod {
	p := writerPod(name, claim, false)
	p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"}
	return p
}

func (l *Lab) createPod(p *corev1.Pod) error {
	ctx, cancel := l.ctx()
	defer cancel()
	_, err := l.cs.CoreV1().Pods(workloadNamespace).Create(ctx, p, metav1.CreateOptions{})
	return err
}

// deletePodAndUnstage deletes pod name and waits until it is gone and
// kubelet has unstaged handle.
func (l *Lab) deletePodAndUnstage(name, handle string) error {
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	ctx, cancel := l.ctx()
	err = l.cs.CoreV1().Pods(workloadNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	cancel()
	if err != nil {
		return err
	}
	return l.wait(5*time.Minute, name+" gone and "+handle+" unstaged", func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		for _, r := range calls(rpcs[len(before):], "NodeUnstageVolume", handle) {
			if r.Done > 0 && r.Error == "" {
				return true, nil
			}
		}
		return false, nil
	})
}

// stagedDevice is the kernel's name of the block device mounted at
// staging (from the mount table, by device number).
func stagedDevice(staging string) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	num := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 4 && fs[4] == staging {
			num = fs[2]
		}
	}
	if num == "" {
		return "", fmt.Errorf("nothing mounted at %s", staging)
	}
	target, err := os.Readlink("/sys/dev/block/" + num)
	if err != nil {
		return "", err
	}
	return filepath.Base(target), nil
}

func (l *Lab) filesystemError(handle string) error {
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	if err := l.createPod(idlePod(podFSIdle, "nvme-fs")); err != nil {
		return err
	}
	if _, err := l.waitRunning(podFSIdle, 10*time.Minute); err != nil {
		return err
	}
	after, err := l.rpcs()
	if err != nil {
		return err
	}
	staging := ""
	for _, r := range calls(after[len(before):], "NodeStageVolume", handle) {
		if r.Done > 0 && r.Error == "" {
			staging = r.Field("staging_target_path")
		}
	}
	if staging == "" {
		return fmt.Errorf("no NodeStageVolume of %s for %s", handle, podFSIdle)
	}
	dev, err := stagedDevice(staging)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := os.WriteFile("/sys/fs/ext4/"+dev+"/trigger_fs_error", []byte("pathmend kubelet lab"), 0o200); err != nil {
		return fmt.Errorf("trigger an ext4 error on %s: %w", dev, err)
	}
	l.note("ext4 error triggered on %s (staged at %s) through /sys/fs/ext4/%s/trigger_fs_error", dev, staging, dev)
	readOnly := func(cs []corev1.VolumeHealthCondition) bool {
		for _, c := range cs {
			if c.Status == corev1.VolumeHealthInaccessible && c.Reason == "FilesystemReadOnly" {
				return true
			}
		}
		return false
	}
	seen, err := l.waitVolumeHealth([]string{podFSIdle}, "Inaccessible FilesystemReadOnly in the pod's volume health", 3*time.Minute, readOnly)
	l.note("%s status.volumeHealth[data]: %s", podFSIdle, describeVolumeHealth(seen[podFSIdle]))
	if err != nil {
		return err
	}
	l.note("kubelet wrote FilesystemReadOnly %.1fs after the error", time.Since(t0).Seconds())
	for _, c := range seen[podFSIdle] {
		if c.Reason == "FilesystemReadOnly" {
			l.check(strings.Contains(c.Message, dev) && strings.Contains(c.Message, "restart the volume's pods"), "the condition's message names neither %s nor what to do: %s", dev, c.Message)
		}
	}
	sh, err := l.waitStorageHealth("StorageUnreachable FilesystemReadOnly naming "+handle+" in CSINode", time.Minute, func(cs []storagev1.StorageHealthCondition) bool {
		for _, c := range cs {
			if c.Status == storagev1.StorageUnreachable && c.Reason == "FilesystemReadOnly" && strings.Contains(c.Message, handle) {
				return true
			}
		}
		return false
	})
	l.note("CSINode status.storageHealth[%s]: %s", driverName, describeStorageHealth(sh))
	l.check(err == nil, "CSINode storage health: %v", err)
	_, err = l.waitLines("Staged filesystem is not healthy")
	l.check(err == nil, "pathmend logged no \"Staged filesystem is not healthy\" line: %v", err)

	// Restart the pods: kubelet unstages; the next pod's stage checks the
	// filesystem before it mounts it.
	if err := l.deletePodAndUnstage(podFSIdle, handle); err != nil {
		return err
	}
	// The new pod's stage reads the superblock (it records the error),
	// checks the filesystem and says what the check did.
	checked := func() []string {
		var out []string
		for _, m := range []string{"Filesystem records errors: checking it before mounting", "Filesystem check cleared the recorded errors before mounting", "Filesystem check corrected errors before mounting"} {
			out = append(out, linesWith(l.pathmendLines(m), handle)...)
		}
		return out
	}
	checks := len(checked())
	if err := l.createPod(writerPod(podFSAfter, "nvme-fs", false)); err != nil {
		return err
	}
	if _, err := l.waitRunning(podFSAfter, 10*time.Minute); err != nil {
		return err
	}
	lines := checked()
	l.check(len(lines) >= checks+2, "pathmend logged no \"Filesystem records errors\" line and the check's outcome for the new pod's stage")
	for _, ln := range lines[checks:] {
		l.note("pathmend: %s", ln)
	}
	if err := l.ioProgress([]string{podFSAfter}, 3); err != nil {
		return err
	}
	healthy, err := l.waitVolumeHealth([]string{podFSAfter}, "no condition in the new pod's volume health", 3*time.Minute, volumeHealthy)
	l.note("%s status.volumeHealth[data]: %s", podFSAfter, describeVolumeHealth(healthy[podFSAfter]))
	if err != nil {
		return err
	}
	r, err := l.ioReport(podFSAfter)
	if err != nil {
		return err
	}
	l.check(len(r.Errors) == 0, "%s: %s", podFSAfter, strings.Join(r.Errors, "; "))
	return l.deletePodAndUnstage(podFSAfter, handle)
}
