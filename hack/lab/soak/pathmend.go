package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// pathmend runs `pathmend serve` as the node's DaemonSet would, and kills
// and restarts it as the faults say. Its log is appended across restarts.
type pathmend struct {
	bin, sock, log string
	args           []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

func newPathmend(bin, root, log string, restartIscsid string) *pathmend {
	sock := filepath.Join(root, "csi.sock")
	return &pathmend{bin: bin, sock: sock, log: log, args: []string{
		"serve", "--endpoint", "unix://" + sock, "--node-id", "soak-node",
		"--sys-root", "/sys", "--dev-root", "/dev", "--state-dir", filepath.Join(root, "state"),
		"--kubelet-root", filepath.Join(root, "kubelet"),
		"--heal=repair", "--monitor-interval=1s", "--heal-grace=2s", "--heal-cooldown=15s",
		"--iscsi-stuck-threshold=15s", "--iscsid-restart-cooldown=2m",
		"--iscsid-restart-command=bash " + restartIscsid,
		"--logging-format=json", "-v=4",
	}}
}

// start starts pathmend and waits for its socket. It is a no-op while
// pathmend runs.
func (p *pathmend) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	p.starts++
	for deadline := time.Now().Add(startBound); ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			p.cmd = nil
			return fmt.Errorf("pathmend exited at start (see %s)", p.log)
		default:
		}
		// Connect, not stat: a pathmend SIGKILLed before left its socket
		// file behind, which refuses connections until this one replaced
		// it.
		if c, err := net.DialTimeout("unix", p.sock, time.Second); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pathmend's socket %s did not answer within %s of its start", p.sock, startBound)
		}
	}
}

// kill SIGKILLs pathmend (nothing when it is not running) and reports
// whether it was running.
func (p *pathmend) kill() bool {
	return p.signal(syscall.SIGKILL, 10*time.Second)
}

// stop ends pathmend with SIGTERM, as kubelet stops a pod.
func (p *pathmend) stop() bool {
	return p.signal(syscall.SIGTERM, 40*time.Second)
}

func (p *pathmend) signal(sig syscall.Signal, wait time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		// A process blocked in the kernel (a sysfs write that never
		// returns) does not die: the soak goes on and reports it.
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			fmt.Fprintf(os.Stderr, "soak: pathmend (pid %d) did not exit after SIGKILL: blocked in the kernel\n", p.cmd.Process.Pid)
		}
	}
	p.cmd = nil
	return true
}

// startBound is the safety net of the wait for a started pathmend to
// answer on its socket; a pathmend that exits ends it at once. The e2e
// suite's starts took up to 19 s beside two CPU burners on the host (a
// few seconds idle): 4 minutes is 12x that, as in the e2e suite.
const startBound = 4 * time.Minute
