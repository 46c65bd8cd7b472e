package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Daemon is one long-running process of the lab node (etcd,
// kube-apiserver, containerd, pathmend, the registrar, kubelet), its
// output appended to a log file so a restart keeps the earlier lines.
type Daemon struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startDaemon starts argv in its own process group with its output in
// log.
func startDaemon(name, log string, argv ...string) (*Daemon, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "==== kubelab: starting %s at %s: %s\n", name, time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &Daemon{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// Exited reports whether the process has ended, and how.
func (d *Daemon) Exited() (bool, error) {
	select {
	case <-d.done:
		return true, d.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to grace before SIGKILL.
func (d *Daemon) Stop(grace time.Duration) error {
	if exited, _ := d.Exited(); exited {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", d.Name, grace)
}

// errDied says which daemon ended while the lab waited for something.
type errDied struct {
	name string
	err  error
}

func (e errDied) Error() string { return fmt.Sprintf("%s exited (%v)", e.name, e.err) }

// waitFor polls cond every interval until it holds, returning an error
// naming what after timeout, as soon as cond fails hard, or as soon as one
// of the watched daemons exits.
func waitFor(timeout time.Duration, what string, cond func() (bool, error), watched ...*Daemon) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		var hard hardError
		if errors.As(err, &hard) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err != nil {
			last = err
		}
		for _, d := range watched {
			if exited, derr := d.Exited(); exited {
				return fmt.Errorf("waiting for %s: %w", what, errDied{d.Name, derr})
			}
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
			}
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// hardError ends a waitFor at once: the condition can no longer hold.
type hardError struct{ error }

func (h hardError) Unwrap() error { return h.error }

// command runs a program and returns its combined output.
func command(name string, args ...string) (string, error) {
	return commandEnv(nil, name, args...)
}

// commandEnv is command with env added to the environment.
func commandEnv(env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Shell runs bash snippets with the lab's guest helpers loaded
// (hack/lab/guest/targets.sh and fixtures.sh): the same functions the lab
// walk-through, the fixtures and the e2e tests build targets and faults
// with.
type Shell struct {
	Lab string // the share, /lab
}

// Run runs script and returns its stdout; a non-zero exit is an error
// carrying stderr.
func (s Shell) Run(timeout time.Duration, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := fmt.Sprintf("set -euo pipefail\n. %[1]s/guest/targets.sh\n. %[1]s/guest/fixtures.sh\n%s", s.Lab, script)
	cmd := exec.CommandContext(ctx, "bash", "-c", full)
	cmd.Env = append(os.Environ(), "LAB="+s.Lab, "LAB_BIN="+s.Lab+"/bin")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Daemons the helpers start (iscsid, flakyproxy, multipathd) outlive
	// the snippet; they must not hold its pipes open.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%q: %w: %s", firstLine(script), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// Supervised keeps a process running the way kubelet keeps a container
// of a DaemonSet pod running (restartPolicy Always): when it exits it is
// started again after a pause. node-driver-registrar relies on that: it
// exits when kubelet refuses a registration (as kubelet does while its
// CSINode object does not exist yet, early in its start) and registers
// again from a fresh start.
type Supervised struct {
	name, log string
	argv      []string
	pause     time.Duration

	mu       sync.Mutex
	cur      *Daemon
	restarts int
	stopping bool
	done     chan struct{}
}

func supervise(name, log string, pause time.Duration, argv ...string) (*Supervised, error) {
	d, err := startDaemon(name, log, argv...)
	if err != nil {
		return nil, err
	}
	s := &Supervised{name: name, log: log, argv: argv, pause: pause, cur: d, done: make(chan struct{})}
	go s.loop()
	return s, nil
}

func (s *Supervised) loop() {
	defer close(s.done)
	for {
		s.mu.Lock()
		d := s.cur
		s.mu.Unlock()
		<-d.done
		time.Sleep(s.pause)
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		nd, err := startDaemon(s.name, s.log, s.argv...)
		if err != nil {
			s.mu.Unlock()
			return
		}
		s.cur = nd
		s.restarts++
		s.mu.Unlock()
	}
}

// Restarts is how often the process was started again.
func (s *Supervised) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Stop ends the supervision and the process.
func (s *Supervised) Stop(grace time.Duration) error {
	s.mu.Lock()
	s.stopping = true
	d := s.cur
	s.mu.Unlock()
	err := d.Stop(grace)
	<-s.done
	return err
}
