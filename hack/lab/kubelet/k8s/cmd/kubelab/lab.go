package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Lab is one run: the node's daemons, the API client, the steps done.
type Lab struct {
	share, out, bin, run string
	sh                   Shell
	pki                  *PKI
	cs                   kubernetes.Interface
	daemons              map[string]*Daemon
	registrar            *Supervised
	unstageable          map[string]bool // volume IDs whose NodeStage is meant to fail
	steps                []*Step
	cur                  *Step
	t0                   time.Time
	memMu                sync.Mutex
	memMinKiB            int64 // lowest MemAvailable seen
	// retries are the steps made again, each with its cause: the report
	// counts them (a finding each, not a pass).
	retries []string
	// closest is the wait that came nearest its limit (took/limit): the
	// report names it, so a wait that a slower guest would miss shows
	// before it fails.
	closest waitRecord
}

// waitRecord is one wait's time against its limit.
type waitRecord struct {
	What        string
	Took, Limit time.Duration
}

func (w waitRecord) ratio() float64 {
	if w.Limit <= 0 {
		return 0
	}
	return w.Took.Seconds() / w.Limit.Seconds()
}

// Step is one timed part of the scenario. Failures are assertions that
// did not hold; the step goes on after one (Run stops after the step).
type Step struct {
	Name     string
	Took     time.Duration
	Notes    []string
	Failures []string
}

func newLab(share, run string) *Lab {
	return &Lab{
		share: share, out: filepath.Join(share, "out"), bin: filepath.Join(share, "bin"), run: run,
		sh: Shell{Lab: share}, daemons: map[string]*Daemon{}, unstageable: map[string]bool{}, t0: time.Now(),
	}
}

// step runs fn as a timed step. An error from fn ends the run; so do
// failed assertions, once the step is over.
func (l *Lab) step(name string, fn func() error) error {
	s := &Step{Name: name}
	l.cur = s
	l.steps = append(l.steps, s)
	fmt.Printf("\n==> [%6.1fs] %s\n", time.Since(l.t0).Seconds(), name)
	start := time.Now()
	err := fn()
	s.Took = time.Since(start)
	l.cur = nil
	if err != nil {
		s.Failures = append(s.Failures, err.Error())
		fmt.Printf("    FAILED: %v\n", err)
		return fmt.Errorf("%s: %w", name, err)
	}
	// A failed assertion leaves the node as the step expects it: the
	// scenario goes on, so one run shows every assertion that fails, and
	// Run fails at its end.
	if len(s.Failures) > 0 {
		fmt.Printf("    done in %.1fs, %d assertions FAILED\n", s.Took.Seconds(), len(s.Failures))
		return nil
	}
	fmt.Printf("    done in %.1fs\n", s.Took.Seconds())
	return nil
}

// failedSteps names the steps with a failed assertion.
func (l *Lab) failedSteps() error {
	var names []string
	for _, s := range l.steps {
		if len(s.Failures) > 0 {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("assertions failed in %d steps: %s", len(names), strings.Join(names, "; "))
}

// note records and prints a fact of the current step.
func (l *Lab) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Printf("    %s\n", msg)
	if l.cur != nil {
		l.cur.Notes = append(l.cur.Notes, msg)
	}
}

// retried records that part of the current step was made again, and why.
func (l *Lab) retried(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Printf("    RETRY (a finding, not a pass): %s\n", msg)
	name := "bring-up"
	if l.cur != nil {
		name = l.cur.Name
	}
	l.retries = append(l.retries, name+": "+msg)
}

// check records a failed assertion on the current step unless ok.
func (l *Lab) check(ok bool, format string, args ...any) {
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	fmt.Printf("    FAIL: %s\n", msg)
	l.cur.Failures = append(l.cur.Failures, msg)
}

// watched is every daemon: a wait ends as soon as one of them exits.
func (l *Lab) watched() []*Daemon {
	var ds []*Daemon
	for _, d := range l.daemons {
		ds = append(ds, d)
	}
	return ds
}

// wait is waitFor watching every daemon; it keeps the wait that came
// nearest its limit for the report.
func (l *Lab) wait(timeout time.Duration, what string, cond func() (bool, error)) error {
	t0 := time.Now()
	err := waitFor(timeout, what, cond, l.watched()...)
	if r := (waitRecord{What: what, Took: time.Since(t0), Limit: timeout}); r.ratio() > l.closest.ratio() {
		l.closest = r
	}
	return err
}

// start starts a daemon logging to <out>/<name>.log.
func (l *Lab) start(name string, argv ...string) error {
	d, err := startDaemon(name, filepath.Join(l.out, name+".log"), argv...)
	if err != nil {
		return err
	}
	l.daemons[name] = d
	return nil
}

// stop stops a daemon and forgets it.
func (l *Lab) stop(name string, grace time.Duration) error {
	d, ok := l.daemons[name]
	if !ok {
		return nil
	}
	delete(l.daemons, name)
	return d.Stop(grace)
}

func (l *Lab) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// Run brings the node up, runs the scenario and always stops the node.
func (l *Lab) Run() (err error) {
	defer func() {
		if err != nil {
			l.diagnose()
		}
		l.shutdown()
	}()
	for _, f := range []func() error{l.bringUp, l.scenario} {
		if err := f(); err != nil {
			return err
		}
	}
	return l.failedSteps()
}

// shutdown stops the daemons in reverse order of their dependencies and
// tears the targets down.
func (l *Lab) shutdown() {
	if err := l.stop("kubelet", 20*time.Second); err != nil {
		fmt.Printf("    %v\n", err)
	}
	if l.registrar != nil {
		if err := l.registrar.Stop(10 * time.Second); err != nil {
			fmt.Printf("    %v\n", err)
		}
	}
	for _, n := range []string{"pathmend", "containerd", "kube-apiserver", "etcd"} {
		if err := l.stop(n, 20*time.Second); err != nil {
			fmt.Printf("    %v\n", err)
		}
	}
	if _, err := l.sh.Run(2*time.Minute, "lab_teardown_all"); err != nil {
		fmt.Printf("    teardown: %v\n", err)
	}
}

// client is the admin's API client.
func (l *Lab) client() (kubernetes.Interface, error) {
	cfg := &rest.Config{
		Host:            fmt.Sprintf("https://%s", net.JoinHostPort(nodeIP, fmt.Sprint(apiPort))),
		BearerToken:     l.pki.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: l.pki.CACert},
		QPS:             50,
		Burst:           100,
		Timeout:         30 * time.Second,
		UserAgent:       "kubelab",
	}
	return kubernetes.NewForConfig(cfg)
}

// report writes the step table to w and to <out>/kubelet-lab.md.
func (l *Lab) report(w io.Writer, runErr error) {
	var b strings.Builder
	total := time.Since(l.t0)
	fmt.Fprintf(&b, "| step | seconds | result |\n| --- | ---: | --- |\n")
	for _, s := range l.steps {
		res := "ok"
		if len(s.Failures) > 0 {
			res = "FAILED: " + strings.Join(s.Failures, "; ")
		}
		fmt.Fprintf(&b, "| %s | %.1f | %s |\n", s.Name, s.Took.Seconds(), strings.ReplaceAll(res, "|", "/"))
	}
	fmt.Fprintf(&b, "| **total** (guest, from kubelab's start) | %.1f | %s |\n", total.Seconds(), map[bool]string{true: "ok", false: "FAILED"}[runErr == nil])
	fmt.Fprintf(&b, "\nRetries: %d (each a finding, not a pass).\n", len(l.retries))
	for _, r := range l.retries {
		fmt.Fprintf(&b, "- %s\n", r)
	}
	if c := l.closest; c.Limit > 0 {
		fmt.Fprintf(&b, "\nClosest wait: %s took %.1fs of its %s limit (1/%.1f).\n", c.What, c.Took.Seconds(), c.Limit, 1/c.ratio())
	}
	l.memMu.Lock()
	if l.memMinKiB > 0 {
		fmt.Fprintf(&b, "\nLowest MemAvailable in the guest: %d MiB.\n", l.memMinKiB/1024)
	}
	l.memMu.Unlock()
	b.WriteString("\nNotes:\n\n")
	for _, s := range l.steps {
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "- %s: %s\n", s.Name, n)
		}
	}
	fmt.Fprintf(w, "\n==================== kubelet lab ====================\n%s", b.String())
	_ = os.WriteFile(filepath.Join(l.out, "kubelet-lab.md"), []byte(b.String()), 0o644)
}

// diagnose prints what a failed run needs: the pods' states and events,
// and the last lines of kubelet's and pathmend's logs.
func (l *Lab) diagnose() {
	fmt.Println("\n==> diagnostics")
	if l.cs != nil {
		ctx, cancel := l.ctx()
		pods, err := l.cs.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{})
		cancel()
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				fmt.Printf("    pod %s: %s, %s\n", p.Name, p.Status.Phase, containerState(p))
				l.podEvents(p.Name)
			}
		}
	}
	for _, name := range []string{"kubelet", "pathmend", "labregistrar", "containerd", "kube-apiserver"} {
		tail(filepath.Join(l.out, name+".log"), 25)
	}
}

// tail prints the last n lines of a file.
func tail(path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	fmt.Printf("    --- last %d lines of %s\n", min(n, len(lines)), path)
	for _, line := range lines[max(0, len(lines)-n):] {
		fmt.Printf("    %s\n", line)
	}
}

// sampleMemory records the lowest MemAvailable every 2 s: what the guest
// needs of LAB_MEM.
func (l *Lab) sampleMemory() {
	for {
		b, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "MemAvailable:" {
				if kib, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					l.memMu.Lock()
					if l.memMinKiB == 0 || kib < l.memMinKiB {
						l.memMinKiB = kib
					}
					l.memMu.Unlock()
				}
			}
		}
		time.Sleep(2 * time.Second)
	}
}
