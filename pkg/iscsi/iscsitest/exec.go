package iscsitest

import (
	"context"
	"slices"
	"strings"
	"sync"

	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// Result is what a fake command answers.
type Result struct {
	// Out is the combined output.
	Out string
	// Code is the exit status; 0 is success.
	Code int
	// Err, when set, is returned instead of an exit status (a command
	// that could not start: exec.ErrExecutableNotFound).
	Err error
}

// Exec is an exec.Interface whose commands are answered by Handler, in
// any order and from any goroutine (k8s.io/utils/exec/testing.FakeExec
// insists on a scripted order, which parallel logins do not have). Every
// command line is recorded. Handler gets the command's context, so a
// fake can block until the caller's deadline like a hung iscsiadm.
type Exec struct {
	Handler func(ctx context.Context, argv []string) Result

	mu    sync.Mutex
	calls [][]string
}

var _ exec.Interface = (*Exec)(nil)

// Command runs without a context.
func (e *Exec) Command(cmd string, args ...string) exec.Cmd {
	return e.CommandContext(context.Background(), cmd, args...)
}

// CommandContext returns a FakeCmd whose CombinedOutput (and Output)
// answers through Handler.
func (e *Exec) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	argv := append([]string{cmd}, args...)
	action := func() ([]byte, []byte, error) {
		e.mu.Lock()
		e.calls = append(e.calls, slices.Clone(argv))
		e.mu.Unlock()
		r := Result{}
		if e.Handler != nil {
			r = e.Handler(ctx, argv)
		}
		switch {
		case ctx.Err() != nil:
			return []byte(r.Out), nil, ctx.Err()
		case r.Err != nil:
			return []byte(r.Out), nil, r.Err
		case r.Code != 0:
			return []byte(r.Out), nil, testingexec.FakeExitError{Status: r.Code}
		}
		return []byte(r.Out), nil, nil
	}
	fc := &testingexec.FakeCmd{
		CombinedOutputScript: []testingexec.FakeAction{action},
		OutputScript:         []testingexec.FakeAction{action},
	}
	return testingexec.InitFakeCmd(fc, cmd, args...)
}

// LookPath finds every command.
func (e *Exec) LookPath(file string) (string, error) { return file, nil }

// Calls returns every command line run so far, in order.
func (e *Exec) Calls() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]string, len(e.calls))
	for i, c := range e.calls {
		out[i] = slices.Clone(c)
	}
	return out
}

// Lines returns every command line joined with spaces, in order.
func (e *Exec) Lines() []string {
	var out []string
	for _, c := range e.Calls() {
		out = append(out, strings.Join(c, " "))
	}
	return out
}

// Has reports whether argv (after any prefix) contains every word of
// want in order, e.g. Has(argv, "-m", "session", "-u").
func Has(argv []string, want ...string) bool {
	i := 0
	for _, a := range argv {
		if i < len(want) && a == want[i] {
			i++
		}
	}
	return i == len(want)
}
