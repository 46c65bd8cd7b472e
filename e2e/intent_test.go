//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The node's intent on the real kernel: a stage held between its attach
// and its mount, deterministically, by a mkfs.ext4 put first in
// pathmend's PATH. While the test's hold file exists that mkfs writes its
// own pid and its parent's (pathmend's) and blocks on a fifo until the
// test releases it; then, and without a hold, it runs the real mkfs.ext4.
// NodeStage calls mkfs after the attach is done (every session logged in,
// every controller connected, the device found) and before the mount.

// mkfsHold is the held mkfs.ext4 of one test.
type mkfsHold struct{ dir string }

// holdMkfs puts the held mkfs.ext4 first in PATH for the pathmend
// processes the test starts from now on.
func holdMkfs(t *testing.T) *mkfsHold {
	t.Helper()
	real, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Fatal(err)
	}
	h := &mkfsHold{dir: t.TempDir()}
	if err := syscall.Mkfifo(h.path("release"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.path("bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
if [ -e %[1]s/hold ]; then
	echo "$$ $PPID" >%[1]s/entered.tmp && mv %[1]s/entered.tmp %[1]s/entered
	read line <%[1]s/release
fi
exec %[2]s "$@"
`, h.dir, real)
	if err := os.WriteFile(h.path("bin", "mkfs.ext4"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", h.path("bin")+":"+os.Getenv("PATH"))
	t.Cleanup(func() { h.unhold(); h.release() })
	return h
}

func (h *mkfsHold) path(elem ...string) string {
	return filepath.Join(append([]string{h.dir}, elem...)...)
}

// hold makes the next mkfs wait for release.
func (h *mkfsHold) hold(t *testing.T) {
	t.Helper()
	_ = os.Remove(h.path("entered"))
	if err := os.WriteFile(h.path("hold"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (h *mkfsHold) unhold() { _ = os.Remove(h.path("hold")) }

// entered waits for a held mkfs and returns its pid and pathmend's.
func (h *mkfsHold) entered(t *testing.T, d time.Duration) (mkfs, pathmend int) {
	t.Helper()
	var b []byte
	eventually(t, d, "NodeStage held in its mkfs (after the attach, before the mount)", func() bool {
		var err error
		b, err = os.ReadFile(h.path("entered"))
		return err == nil
	})
	f := strings.Fields(string(b))
	if len(f) != 2 {
		t.Fatalf("held mkfs wrote %q", b)
	}
	mkfs, _ = strconv.Atoi(f[0])
	pathmend, _ = strconv.Atoi(f[1])
	return mkfs, pathmend
}

// release lets a held mkfs go on; it reports whether one was waiting.
// A held mkfs opens the fifo right after it wrote "entered"; on a loaded
// guest that can take a while, so release waits for its reader up to 2
// minutes — only when a held mkfs entered and was not released yet.
func (h *mkfsHold) release() bool {
	if !fileExists(h.path("entered")) {
		return false
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		f, err := os.OpenFile(h.path("release"), os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if errors.Is(err, syscall.ENXIO) { // no reader yet
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			return false
		}
		_, _ = f.WriteString("go\n")
		f.Close()
		_ = os.Remove(h.path("entered"))
		return true
	}
	return false
}

// sigkill kills a process and reaps nothing (pathmend's waiter does).
func sigkill(t *testing.T, pid int, what string) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s (%d): %v", what, pid, err)
	}
}

// killedInMkfs stages a volume with mkfs held, SIGKILLs pathmend (and
// its mkfs) there, and checks what the kill left: the attach done, and
// the record attaching.
func killedInMkfs(t *testing.T, h *mkfsHold, node csi.NodeClient, dir string, req *csi.NodeStageVolumeRequest, attached func() bool) {
	t.Helper()
	h.hold(t)
	done := stageInBackgroundFor(node, req)
	mkfs, pathmend := h.entered(t, 5*time.Minute)
	if !attached() {
		t.Fatal("held in mkfs before the attach was done")
	}
	sigkill(t, pathmend, "pathmend")
	sigkill(t, mkfs, "the held mkfs")
	_ = os.Remove(h.path("entered")) // nothing waits for a release now
	h.unhold()
	if err := <-done; err == nil {
		t.Fatal("NodeStage succeeded although pathmend was killed in it")
	}
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(req.VolumeId)
	if err != nil {
		t.Fatalf("record after the kill: %v (the record is written before the first connect or login)", err)
	}
	if rec.State != volume.StateAttaching {
		t.Fatalf("record after the kill is %s, want attaching", rec.State)
	}
	t.Logf("killed pathmend %d in mkfs %d: record %s, attach done", pathmend, mkfs, rec.State)
}

// stageInBackgroundFor starts a NodeStage and returns its result.
func stageInBackgroundFor(node csi.NodeClient, req *csi.NodeStageVolumeRequest) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := node.NodeStageVolume(ctx, req)
		done <- err
	}()
	return done
}

// unstagedAfterRestart unstages a volume through a restarted pathmend and
// checks that its record is gone.
func unstagedAfterRestart(t *testing.T, l lab, dir, id, staging string) {
	t.Helper()
	// The killed process left its socket: the wait for the new one's
	// must not take it for a live one.
	if err := os.Remove(filepath.Join(dir, "csi.sock")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(p.conn)
	rpc(t, "NodeUnstageVolume after the restart", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(id); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("record after the unstage: %v, want none", err)
	}
}

// iscsiNodeRecords lists the node records of iqn (iscsiadm is the only
// place they are kept).
func iscsiNodeRecords(t *testing.T, iqn string) []string {
	t.Helper()
	out, _ := exec.Command("iscsiadm", "-m", "node").CombinedOutput()
	var recs []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, iqn) {
			recs = append(recs, strings.TrimSpace(line))
		}
	}
	return recs
}

// TestIntent_KilledBetweenAttachAndMountThenUnstagedLeavesNothing is the
// issue's first case on the real kernel: pathmend SIGKILLed while
// NodeStage is between its attach and its mount (both logins done, both
// controllers connected); restarted; kubelet unstages the volume (the pod
// is gone): no session, node record (with the CHAP credentials),
// controller or record is left.
func TestIntent_KilledBetweenAttachAndMountThenUnstagedLeavesNothing(t *testing.T) {
	l := needLab(t)
	t.Run("iscsi", func(t *testing.T) {
		l.teardownAll(t)
		const iqn = "iqn.2024-01.io.pathmend.lab:e2e-intent-kill"
		lioTarget(t, l, iqn, "e2e-intent-kill", "e2e-intent-user", "e2e-intent-secret-1", "127.0.0.1", "127.0.0.2")
		h := holdMkfs(t)
		dir := t.TempDir()
		p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
		staging := filepath.Join(dir, "staging")
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		unmountOnCleanup(t, staging)
		req := stageReq("vol-intent-kill-iscsi", staging, map[string]string{
			"transport": "iscsi", "iqn": iqn, "portals": "127.0.0.1:3260,127.0.0.2:3260", "lun": "0"})
		req.Secrets = map[string]string{"chapUsername": "e2e-intent-user", "chapPassword": "e2e-intent-secret-1"}
		sys := sysfs.New("/sys")
		killedInMkfs(t, h, csi.NewNodeClient(p.conn), dir, req, func() bool {
			a, okA := sessionTo(t, sys, iqn, "127.0.0.1:3260")
			b, okB := sessionTo(t, sys, iqn, "127.0.0.2:3260")
			return okA && okB && a.State.LoggedIn() && b.State.LoggedIn() && len(iscsiNodeRecords(t, iqn)) == 2
		})
		unstagedAfterRestart(t, l, dir, req.VolumeId, staging)
		for _, portal := range []string{"127.0.0.1:3260", "127.0.0.2:3260"} {
			if s, ok := sessionTo(t, sys, iqn, portal); ok {
				t.Errorf("session %s to %s left after the unstage", s.ID, portal)
			}
		}
		if recs := iscsiNodeRecords(t, iqn); len(recs) > 0 {
			t.Errorf("node records left after the unstage: %v", recs)
		}
	})
	t.Run("nvme", func(t *testing.T) {
		l.teardownAll(t)
		const nqn = "nqn.2024-01.io.pathmend.lab:e2e-intent-kill"
		nvmeTwoPortTarget(t, l, nqn)
		h := holdMkfs(t)
		dir := t.TempDir()
		p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
		staging := filepath.Join(dir, "staging")
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		unmountOnCleanup(t, staging)
		req := stageReq("vol-intent-kill-nvme", staging, twoPathContext(nqn, 1))
		killedInMkfs(t, h, csi.NewNodeClient(p.conn), dir, req, func() bool {
			_, legs, ok := headOf(t, nqn, 1)
			return ok && len(legs) == 2 && len(controllersOf(t, nqn)) == 2
		})
		unstagedAfterRestart(t, l, dir, req.VolumeId, staging)
		eventually(t, time.Minute, "no controller left after the unstage", func() bool { return len(controllersOf(t, nqn)) == 0 })
	})
}

// TestIntent_UnstageWhileACoTenantIsStagingKeepsItsPaths is the issue's
// third case on the real kernel: namespaces 1 and 2 of one subsystem;
// NodeUnstage of the first while NodeStage of the second is held between
// its attach and its mount. The unstage answers OK at once (the second's
// stage holds no lease in its mkfs) and takes no controller: the second
// keeps both paths, finishes staging and is healthy.
func TestIntent_UnstageWhileACoTenantIsStagingKeepsItsPaths(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-intent-cotenant"
	nvmeTwoPortTarget(t, l, nqn)
	l.sh(t, fmt.Sprintf(`dev=$(lab_loop_create e2e-nvme-2 64); nvmet_ns_add %q 2 "$dev" 1 "$(lab_uuid_of %q/2)"`, nqn, nqn))
	h := holdMkfs(t)
	dir := t.TempDir()
	p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(p.conn)
	s1, s2 := filepath.Join(dir, "s1"), filepath.Join(dir, "s2")
	for _, s := range []string{s1, s2} {
		if err := os.MkdirAll(s, 0o750); err != nil {
			t.Fatal(err)
		}
		unmountOnCleanup(t, s)
	}
	rpc(t, "NodeStageVolume vol-ns1", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-ns1", s1, twoPathContext(nqn, 1)))
		return err
	})
	h.hold(t)
	done := stageInBackgroundFor(node, stageReq("vol-ns2", s2, twoPathContext(nqn, 2)))
	h.entered(t, 5*time.Minute)
	before := controllersOf(t, nqn)
	_, legsBefore, ok := headOf(t, nqn, 2)
	if !ok || len(legsBefore) != 2 || len(before) != 2 {
		t.Fatalf("vol-ns2 held in mkfs with controllers %v and legs %v, want 2 of each", before, legsBefore)
	}
	start := time.Now()
	rpc(t, "NodeUnstageVolume vol-ns1 (vol-ns2 in its mkfs)", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-ns1", StagingTargetPath: s1})
		return err
	})
	t.Logf("NodeUnstage of vol-ns1 answered in %s while vol-ns2 was in its mkfs", time.Since(start).Round(time.Millisecond))
	select {
	case err := <-done:
		t.Fatalf("vol-ns2's stage ended while its mkfs was held: %v", err)
	default:
	}
	if after := controllersOf(t, nqn); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("the unstage of vol-ns1 changed the controllers while vol-ns2 was staging: %v → %v", before, after)
	}
	if _, legs, ok := headOf(t, nqn, 2); !ok || len(legs) != 2 {
		t.Fatalf("vol-ns2's paths after vol-ns1's unstage: %v (found %v), want 2", legs, ok)
	}
	h.unhold()
	if !h.release() {
		t.Fatal("no held mkfs to release")
	}
	if err := <-done; err != nil {
		t.Fatalf("vol-ns2's stage after the release: %v", err)
	}
	eventually(t, 2*time.Minute, "vol-ns2 healthy (both paths)", func() bool {
		return len(volumeHealth(t, node, "vol-ns2")) == 0
	})
	if err := os.WriteFile(filepath.Join(s2, "still-here"), []byte("ok"), 0o600); err != nil {
		t.Fatalf("vol-ns2 unusable: %v", err)
	}
	rpc(t, "NodeUnstageVolume vol-ns2", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-ns2", StagingTargetPath: s2})
		return err
	})
	eventually(t, time.Minute, "no controller left after the last unstage", func() bool { return len(controllersOf(t, nqn)) == 0 })
}
