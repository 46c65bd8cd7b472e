package iscsi

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

var nsenter = []string{"nsenter", "--mount=/proc/1/ns/mnt", "--"}

func newInitiator(t *testing.T, ex *iscsitest.Exec, mod func(*InitiatorConfig)) *Initiator {
	t.Helper()
	cfg := InitiatorConfig{Exec: ex, Sys: sysfs.New(t.TempDir()), CommandPrefix: nsenter}
	if mod != nil {
		mod(&cfg)
	}
	in, err := NewInitiator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// captureLogs sends klog output at verbosity v to a buffer for this test.
func captureLogs(t *testing.T, v string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false", "-v=" + v}); err != nil {
		t.Fatal(err)
	}
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(nil)
		_ = fs.Set("logtostderr", "true")
		_ = fs.Set("v", "0")
	})
	return &buf
}

var node1 = Node{Target: "iqn.2024-01.io.example:t", Portal: volume.Endpoint{Host: "127.0.0.1", Port: 3260}}

// Every operation's command line, through the host-entry prefix.
func TestInitiator_CommandLines(t *testing.T) {
	ex := &iscsitest.Exec{}
	in := newInitiator(t, ex, func(c *InitiatorConfig) { c.RestartCommand = []string{"rc-service", "iscsid", "restart"} })
	ctx := context.Background()
	v6 := Node{Target: "iqn.x:y", Portal: volume.Endpoint{Host: "fd00::1", Port: 3261}, Iface: "eth1"}
	steps := []func() error{
		func() error { _, err := in.NodeExists(ctx, node1); return err },
		func() error { return in.CreateNode(ctx, node1) },
		func() error { return in.Discover(ctx, v6.Portal, v6.Iface) },
		func() error { return in.UpdateNode(ctx, node1, []Setting{{Name: "node.startup", Value: "manual"}}) },
		func() error { return in.Login(ctx, v6) },
		func() error { return in.Logout(ctx, node1, 7) },
		func() error { return in.DeleteNode(ctx, node1) },
		func() error { return in.FlushMap(ctx, "mpatha") },
		func() error { return in.ResizeMap(ctx, "mpatha") },
		func() error { return in.RestartDaemon(ctx) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	p := strings.Join(nsenter, " ") + " "
	want := []string{
		p + "iscsiadm -m node -T iqn.2024-01.io.example:t -p 127.0.0.1:3260 -I default",
		p + "iscsiadm -m node -T iqn.2024-01.io.example:t -p 127.0.0.1:3260 -I default -o new",
		p + "iscsiadm -m discovery -t sendtargets -p [fd00::1]:3261 -I eth1 -o new",
		p + "iscsiadm -m node -T iqn.2024-01.io.example:t -p 127.0.0.1:3260 -I default -o update -n node.startup -v manual",
		p + "iscsiadm -m node -T iqn.x:y -p [fd00::1]:3261 -I eth1 --login",
		p + "iscsiadm -m session -r 7 -u",
		p + "iscsiadm -m node -T iqn.2024-01.io.example:t -p 127.0.0.1:3260 -I default -o delete",
		p + "multipath -f mpatha",
		p + "multipathd resize map mpatha",
		p + "rc-service iscsid restart",
	}
	if diff := cmp.Diff(want, ex.Lines()); diff != "" {
		t.Errorf("command lines (-want +got):\n%s", diff)
	}
}

// CHAP secrets must travel in argv (iscsiadm reads values nowhere else)
// but never reach a log line or an error, even when iscsiadm echoes them.
func TestInitiator_SecretsNeverReachLogsOrErrors(t *testing.T) {
	logs := captureLogs(t, "5")
	const secret = "s3cr3t-CHAP-pw"
	ex := &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		if iscsitest.Has(argv, "-v", secret) {
			return iscsitest.Result{Out: "iscsiadm: cannot set value " + secret, Code: int(ExitInvalid)}
		}
		return iscsitest.Result{}
	}}
	in := newInitiator(t, ex, nil)
	err := in.UpdateNode(context.Background(), node1, []Setting{
		{Name: "node.session.auth.authmethod", Value: "CHAP"},
		{Name: "node.session.auth.password", Value: secret, Secret: true},
	})
	klog.Flush()
	if err == nil {
		t.Fatal("want the update to fail")
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(logs.String(), secret) {
		t.Fatalf("secret leaked:\nerror: %v\nlogs:\n%s", err, logs)
	}
	if !strings.Contains(err.Error(), "-v ***: exit 7") || !strings.Contains(err.Error(), "cannot set value ***") {
		t.Errorf("error does not show the redacted command and output: %v", err)
	}
	if !strings.Contains(logs.String(), "-n node.session.auth.password -v ***") {
		t.Errorf("the redacted command line is not logged at level 4:\n%s", logs)
	}
	calls := ex.Calls()
	if !iscsitest.Has(calls[len(calls)-1], "-v", secret) {
		t.Error("the secret did not reach iscsiadm")
	}
}

// iscsiadm's exit codes (include/iscsi_err.h) become typed errors, and the
// operations treat the benign ones as success.
func TestInitiator_ExitCodes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		code ExitCode
		op   func(*Initiator) error
		want error // nil: success
	}{
		{"login: session exists", ExitSessionExists, func(in *Initiator) error { return in.Login(ctx, node1) }, nil},
		{"login: auth", ExitLoginAuthFailed, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrAuthFailed},
		{"login: fatal", ExitFatalLogin, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrLoginFatal},
		{"login: timeout", ExitTransportTimeout, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrTimeout},
		{"login: transport", ExitTransport, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrUnreachable},
		{"login: no record", ExitNoObjects, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrNoObjects},
		{"login: iscsid down", ExitISCSIDNotConnected, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrDaemon},
		{"logout: not connected", ExitSessionNotConnected, func(in *Initiator) error { return in.Logout(ctx, node1, 3) }, ErrNotConnected},
		{"logout: gone", ExitNoObjects, func(in *Initiator) error { return in.Logout(ctx, node1, 3) }, nil},
		{"delete: gone", ExitNoObjects, func(in *Initiator) error { return in.DeleteNode(ctx, node1) }, nil},
		{"exists: no", ExitNoObjects, func(in *Initiator) error {
			ok, err := in.NodeExists(ctx, node1)
			if ok {
				return errors.New("exists")
			}
			return err
		}, nil},
		{"prefix: command missing", 127, func(in *Initiator) error { return in.Login(ctx, node1) }, ErrCommandNotFound},
		{"multipath: busy is not iscsiadm's 28", ExitBusy, func(in *Initiator) error { return in.FlushMap(ctx, "m") }, errCode(ExitBusy)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := &iscsitest.Exec{Handler: func(context.Context, []string) iscsitest.Result {
				return iscsitest.Result{Code: int(tc.code), Out: "iscsiadm: failure text"}
			}}
			err := tc.op(newInitiator(t, ex, nil))
			switch want := tc.want.(type) {
			case nil:
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
			case errCode:
				if code, ok := Exit(err); !ok || code != ExitCode(want) || errors.Is(err, ErrBusy) {
					t.Fatalf("got %v (code %v), want exit %d untyped", err, code, want)
				}
			default:
				if !errors.Is(err, want) {
					t.Fatalf("got %v, want %v", err, want)
				}
				if code, ok := Exit(err); !ok || code != tc.code {
					t.Errorf("Exit = %v %v, want %v", code, ok, tc.code)
				}
			}
		})
	}
}

type errCode ExitCode

func (e errCode) Error() string { return ExitCode(e).String() }

func TestInitiator_CommandThatCannotStart(t *testing.T) {
	ex := &iscsitest.Exec{Handler: func(context.Context, []string) iscsitest.Result {
		return iscsitest.Result{Err: exec.ErrExecutableNotFound}
	}}
	err := newInitiator(t, ex, nil).Login(context.Background(), node1)
	if !errors.Is(err, ErrCommandNotFound) {
		t.Fatalf("got %v", err)
	}
	if _, ok := Exit(err); ok {
		t.Error("a command that did not start has no exit code")
	}
}

// LoginAll runs at most LoginConcurrency logins at once, and a login that
// hangs ends at the login timeout without holding up the others.
func TestInitiator_LoginAllIsBoundedAndEachLoginHasItsTimeout(t *testing.T) {
	var running, peak atomic.Int32
	ex := &iscsitest.Exec{Handler: func(ctx context.Context, argv []string) iscsitest.Result {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if iscsitest.Has(argv, "127.0.0.9:3260") {
			<-ctx.Done() // a login that never answers
			return iscsitest.Result{}
		}
		time.Sleep(20 * time.Millisecond)
		return iscsitest.Result{}
	}}
	in := newInitiator(t, ex, func(c *InitiatorConfig) { c.LoginConcurrency = 2; c.LoginTimeout = 300 * time.Millisecond })
	var nodes []Node
	for _, h := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.9", "127.0.0.4", "127.0.0.5"} {
		nodes = append(nodes, Node{Target: "iqn.x:y", Portal: volume.Endpoint{Host: h, Port: 3260}})
	}
	errs := in.LoginAll(context.Background(), nodes)
	for i, err := range errs {
		if hung := i == 2; hung != (err != nil) {
			t.Errorf("login %s: %v", nodes[i].Portal, err)
		}
	}
	if !errors.Is(errs[2], ErrTimeout) {
		t.Errorf("hung login: %v, want ErrTimeout", errs[2])
	}
	if p := peak.Load(); p > 2 || p < 1 {
		t.Errorf("peak concurrency %d, want at most 2", p)
	}
}

// A restart of iscsid is refused while a login runs, and a login waits
// while a restart runs.
func TestInitiator_RestartAndLoginsExcludeEachOther(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 4)
	ex := &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		entered <- argv[len(argv)-1]
		<-release
		return iscsitest.Result{}
	}}
	in := newInitiator(t, ex, func(c *InitiatorConfig) { c.CommandPrefix = nil })
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = in.Login(ctx, node1) }()
	<-entered
	if in.InFlight() != 1 {
		t.Errorf("InFlight = %d, want 1", in.InFlight())
	}
	if err := in.RestartDaemon(ctx); !errors.Is(err, ErrInFlight) {
		t.Fatalf("restart during a login: %v, want ErrInFlight", err)
	}
	release <- struct{}{}
	wg.Wait()

	wg.Add(2)
	go func() { defer wg.Done(); _ = in.RestartDaemon(ctx) }()
	if got := <-entered; got != "iscsid" {
		t.Fatalf("first command %q, want the restart", got)
	}
	go func() { defer wg.Done(); _ = in.Login(ctx, node1) }()
	select {
	case got := <-entered:
		t.Fatalf("%q ran during the restart", got)
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{} // restart done; the login may run
	if got := <-entered; got != "--login" {
		t.Fatalf("after the restart: %q", got)
	}
	release <- struct{}{}
	wg.Wait()
}

// The heal's view (WithExec) runs its commands through its own exec but
// shares the coordination: its restart is refused while NodeStage's login
// runs through the other view, and a relogin of the same node record
// waits for that login.
func TestInitiator_WithExecSharesTheGateAndTheNodeLocks(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 4)
	block := func(who string) *iscsitest.Exec {
		return &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
			entered <- who + " " + argv[len(argv)-1]
			<-release
			return iscsitest.Result{}
		}}
	}
	stage := newInitiator(t, block("stage"), func(c *InitiatorConfig) { c.CommandPrefix = nil })
	healEx := block("heal")
	heal := stage.WithExec(healEx)
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = stage.Login(ctx, node1) }()
	if got := <-entered; got != "stage --login" {
		t.Fatalf("first command %q", got)
	}
	if heal.InFlight() != 1 {
		t.Errorf("the heal's view sees %d in flight, want 1", heal.InFlight())
	}
	if err := heal.RestartDaemon(ctx); !errors.Is(err, ErrInFlight) {
		t.Fatalf("the heal's restart during NodeStage's login: %v, want ErrInFlight", err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = heal.Login(ctx, node1) }()
	select {
	case got := <-entered:
		t.Fatalf("%q ran while the same node record's login ran", got)
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{}
	if got := <-entered; got != "heal --login" {
		t.Fatalf("after NodeStage's login: %q, want the heal's login through its own exec", got)
	}
	release <- struct{}{}
	wg.Wait()
	if n := len(healEx.Calls()); n != 1 {
		t.Errorf("the heal's exec ran %d commands, want 1", n)
	}
}

func TestInitiator_RescanWritesChannelTargetLUNToTheHostsScan(t *testing.T) {
	fsys, dir := tree(t, twoPortals())
	in, err := NewInitiator(InitiatorConfig{Exec: &iscsitest.Exec{}, Sys: fsys})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Rescan(SCSIAddress{Host: 1, Channel: 0, Target: 0, LUN: 3}); err != nil {
		t.Fatal(err)
	}
	if got := readWO(t, dir, "devices/platform/host1/scsi_host/host1/scan"); got != "0 0 3" {
		t.Errorf("scan got %q", got)
	}
	if err := in.Rescan(SCSIAddress{Host: 9}); err == nil || !strings.Contains(err.Error(), "host9") {
		t.Errorf("scan of a missing host: %v", err)
	}
}

func TestNewInitiator_Validates(t *testing.T) {
	ok := InitiatorConfig{Exec: &iscsitest.Exec{}, Sys: sysfs.New("/sys")}
	for name, mod := range map[string]func(*InitiatorConfig){
		"no exec":      func(c *InitiatorConfig) { c.Exec = nil },
		"no sysfs":     func(c *InitiatorConfig) { c.Sys = sysfs.FS{} },
		"empty prefix": func(c *InitiatorConfig) { c.CommandPrefix = []string{"nsenter", ""} },
		"negative":     func(c *InitiatorConfig) { c.LoginTimeout = -1 },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := NewInitiator(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewInitiator(ok); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func TestCommandError_Text(t *testing.T) {
	e := &CommandError{Command: "iscsiadm -m session -r 3 -u", Code: ExitSessionNotConnected, Output: "iscsiadm: Could not logout", kind: ErrNotConnected}
	want := "iscsiadm -m session -r 3 -u: exit 32 (target likely not connected): iscsiadm: Could not logout"
	if e.Error() != want {
		t.Errorf("got  %q\nwant %q", e.Error(), want)
	}
	if ExitCode(99).String() != "99" || ExitSuccess.String() != "0 (success)" {
		t.Error("exit code text")
	}
}
