package iscsi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/scrub"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Defaults of InitiatorConfig.
const (
	DefaultLoginConcurrency = 4
	DefaultLoginTimeout     = 60 * time.Second
	DefaultCommandTimeout   = 30 * time.Second
	// maxOutput bounds the command output kept in an error.
	maxOutput = 1024
)

// DefaultRestartCommand restarts iscsid on a systemd host.
var DefaultRestartCommand = []string{"systemctl", "restart", "iscsid"}

// ErrInFlight is returned by RestartDaemon while a login, logout or node
// update is running: restarting iscsid under it would fail it half-way.
var ErrInFlight = errors.New("a login, logout or node update is in flight")

// InitiatorConfig configures an Initiator.
type InitiatorConfig struct {
	// Exec runs host commands. Required.
	Exec exec.Interface
	// Sys is the sysfs root; rescans are written below it. Required.
	Sys sysfs.FS
	// Writer writes the rescans; Sys when nil. A fake kernel injects
	// itself to act on them.
	Writer interface {
		WriteAttr(rel, value string) error
	}
	// CommandPrefix is prepended to every host command, to run it in the
	// host's mount namespace from a container, e.g.
	// {"nsenter", "--mount=/proc/1/ns/mnt", "--"} or {"chroot", "/host"}.
	// Empty runs commands directly.
	CommandPrefix []string
	// ISCSIAdm, Multipath and Multipathd name the tools; "iscsiadm",
	// "multipath" and "multipathd" when empty.
	ISCSIAdm, Multipath, Multipathd string
	// RestartCommand restarts iscsid; DefaultRestartCommand when empty.
	RestartCommand []string
	// LoginConcurrency bounds the logins LoginAll runs at once;
	// DefaultLoginConcurrency when zero.
	LoginConcurrency int
	// LoginTimeout bounds one login command; DefaultLoginTimeout when zero.
	LoginTimeout time.Duration
	// CommandTimeout bounds every other command; DefaultCommandTimeout
	// when zero.
	CommandTimeout time.Duration
}

// Initiator drives open-iscsi through iscsiadm and the kernel's SCSI scan
// attribute. It is the one place pathmend runs iSCSI host commands, so it
// also knows when a login or logout is in flight (RestartDaemon refuses to
// run then, and they wait while a restart runs). Operations on the same
// node record are serialized. Safe for concurrent use; build one per
// process and share it between the attacher and the session heal (or a
// view of it from WithExec).
type Initiator struct {
	cfg InitiatorConfig
	co  *coordination
}

// coordination is what every view of one Initiator shares.
type coordination struct {
	// gate is held shared by every login, logout and node-record command
	// and exclusively by a restart of iscsid.
	gate     gate
	inFlight atomic.Int32
	// nodes serializes the commands of one node record.
	nodes intent.KeyedLocks[string]
}

// NewInitiator validates cfg and returns an Initiator. Nothing is run.
func NewInitiator(cfg InitiatorConfig) (*Initiator, error) {
	if cfg.Exec == nil {
		return nil, errors.New("initiator: no exec interface")
	}
	if cfg.Sys.Root() == "" || cfg.Sys.Root() == "." {
		return nil, errors.New("initiator: no sysfs root")
	}
	if cfg.LoginConcurrency < 0 || cfg.LoginTimeout < 0 || cfg.CommandTimeout < 0 {
		return nil, errors.New("initiator: concurrency and timeouts must not be negative")
	}
	for _, p := range cfg.CommandPrefix {
		if p == "" {
			return nil, errors.New("initiator: empty word in the command prefix")
		}
	}
	if cfg.Writer == nil {
		cfg.Writer = cfg.Sys
	}
	setDefault(&cfg.ISCSIAdm, "iscsiadm")
	setDefault(&cfg.Multipath, "multipath")
	setDefault(&cfg.Multipathd, "multipathd")
	if len(cfg.RestartCommand) == 0 {
		cfg.RestartCommand = DefaultRestartCommand
	}
	if cfg.LoginConcurrency == 0 {
		cfg.LoginConcurrency = DefaultLoginConcurrency
	}
	if cfg.LoginTimeout == 0 {
		cfg.LoginTimeout = DefaultLoginTimeout
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = DefaultCommandTimeout
	}
	return &Initiator{cfg: cfg, co: &coordination{}}, nil
}

// WithExec returns a view of in that runs its commands through e (the
// session heal's, which counts them) but shares in's coordination: a
// restart through either refuses while a login or logout runs through
// the other, and both serialize on the same node-record locks.
func (in *Initiator) WithExec(e exec.Interface) *Initiator {
	cfg := in.cfg
	cfg.Exec = e
	return &Initiator{cfg: cfg, co: in.co}
}

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

// LoginTimeout is the deadline of one login command.
func (in *Initiator) LoginTimeout() time.Duration { return in.cfg.LoginTimeout }

// InFlight is the number of logins, logouts and node-record commands
// running now.
func (in *Initiator) InFlight() int { return int(in.co.inFlight.Load()) }

// command is one host command. secrets are values that must never appear
// in a log line or an error: argv words equal to one are shown as "***"
// and every occurrence in the output is scrubbed.
type command struct {
	name    string
	args    []string
	secrets []string
	// classify maps exit codes to typed errors; only iscsiadm's codes
	// mean what exitErrors says.
	classify bool
}

// String is the redacted command line.
func (c command) String() string {
	words := make([]string, 0, len(c.args)+1)
	words = append(words, c.name)
	for _, a := range c.args {
		if c.isSecret(a) {
			a = "***"
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

func (c command) isSecret(s string) bool {
	for _, x := range c.secrets {
		if x != "" && s == x {
			return true
		}
	}
	return false
}

// scrub removes every secret value from out and bounds its length: the
// command's own secrets, and every secret the process has seen, in every
// spelling, with what the output itself shows of a node record's CHAP
// settings (package scrub). It scrubs before it cuts: a secret cut in
// two would not be recognised later.
func (c command) scrub(out []byte) string {
	s := strings.TrimSpace(string(out))
	for _, x := range c.secrets {
		if x != "" {
			s = strings.ReplaceAll(s, x, "***")
		}
	}
	s = scrub.String(s)
	if len(s) > maxOutput {
		s = s[:maxOutput] + "…"
	}
	return s
}

// iscsiadm builds an iscsiadm command.
func (in *Initiator) iscsiadm(args ...string) command {
	return command{name: in.cfg.ISCSIAdm, args: args, classify: true}
}

// run executes c through the prefix with the given timeout and returns
// its combined output. Failures are *CommandError values.
func (in *Initiator) run(ctx context.Context, timeout time.Duration, c command) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	argv := append(append([]string(nil), in.cfg.CommandPrefix...), c.name)
	argv = append(argv, c.args...)
	klog.FromContext(ctx).V(4).Info("Running host command", "command", c.String())
	start := time.Now()
	out, err := in.cfg.Exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err == nil {
		klog.FromContext(ctx).V(5).Info("Host command done", "command", c.String(), "duration", time.Since(start))
		return out, nil
	}
	ce := &CommandError{Command: c.String(), Code: -1, Output: c.scrub(out)}
	var ee exec.ExitError
	switch {
	case ctx.Err() != nil:
		ce.kind, ce.cause = ErrTimeout, ctx.Err()
	case errors.Is(err, exec.ErrExecutableNotFound):
		ce.kind, ce.cause = ErrCommandNotFound, err
	case errors.As(err, &ee) && ee.Exited():
		ce.Code = ExitCode(ee.ExitStatus())
		if ce.Code == exitCommandNotFound || ce.Code == exitCommandNotExecutable || c.classify {
			ce.kind = exitErrors[ce.Code]
		}
	default:
		ce.cause = err
	}
	return out, ce
}

// shared runs fn holding the gate shared and the node record's lock, and
// counts it as in flight. It waits while a restart of iscsid runs, and for
// another command of the same node record, until ctx ends.
func (in *Initiator) shared(ctx context.Context, n Node, fn func() error) error {
	if err := in.co.gate.enter(ctx); err != nil {
		return err
	}
	defer in.co.gate.leave()
	in.co.inFlight.Add(1)
	defer in.co.inFlight.Add(-1)
	unlock, err := in.co.nodes.Lock(ctx, n.key(), "iscsiadm")
	if err != nil {
		return err
	}
	defer unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn()
}

// RestartDaemon restarts iscsid with the configured command. iscsid
// re-adopts every session from the kernel; each is bounced for about two
// seconds, devices kept. It refuses with ErrInFlight instead of waiting
// when a login, logout or node update is running, and holds every new one
// back until the restart command returns.
func (in *Initiator) RestartDaemon(ctx context.Context) error {
	release, ok := in.co.gate.tryExclusive()
	if !ok {
		return ErrInFlight
	}
	defer release()
	rc := in.cfg.RestartCommand
	_, err := in.run(ctx, in.cfg.CommandTimeout, command{name: rc[0], args: rc[1:]})
	if err != nil {
		return fmt.Errorf("restart iscsid: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Restarted iscsid", "command", strings.Join(rc, " "))
	return nil
}
