package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// companionShared are the flags `pathmend companion` shares with serve:
// the same names, meanings and defaults (but --heal, observe here).
var companionShared = []string{
	"sys-root", "dev-root", "state-dir", "heal", "monitor-interval", "kernel-events", "heal-grace", "heal-cooldown", "heal-max-scope", "connect-timeout",
	"iscsi-stuck-threshold", "iscsid-restart-cooldown", "iscsid-restart-command", "host-command-prefix", "host-mountinfo", "metrics-address",
}

// companionFlags are companion mode's own flags: the action kinds, each
// off unless enabled, and the learning bound. serve takes the NVMe ones
// for its --heal-foreign.
type companionFlags struct {
	actions     companion.Actions
	forgetAfter time.Duration
}

func (c *companionFlags) bindNVMe(fs *flag.FlagSet) {
	fs.BoolVar(&c.actions.NVMeReconnect, "nvme-reconnect", c.actions.NVMeReconnect, "with --heal=repair: connect again, with the learned options, an NVMe endpoint whose controller the kernel gave up (it vanished while reconnecting)")
	fs.BoolVar(&c.actions.NVMeRepairs, "nvme-repairs", c.actions.NVMeRepairs, "with --heal=repair: run the NVMe teardown repairs (NoNamespace, ControllerNotContributing, AmbiguousHead, StaleEndpoint) and connect again what they tore down")
	fs.DurationVar(&c.forgetAfter, "forget-after", c.forgetAfter, "a learned NVMe subsystem whose controllers have all been gone this long is forgotten")
}

func (c *companionFlags) bindISCSI(fs *flag.FlagSet) {
	fs.BoolVar(&c.actions.ISCSIRelogin, "iscsi-relogin", c.actions.ISCSIRelogin, "with --heal=repair: log out and in a stuck iSCSI session whose LUNs all have another live path in their map")
	fs.BoolVar(&c.actions.ISCSIRestart, "iscsid-restart", c.actions.ISCSIRestart, "with --heal=repair: restart iscsid for a stuck session that is a LUN's last path (at most once per --iscsid-restart-cooldown)")
}

func companionCommand() *command {
	return &command{
		name:     "companion",
		summary:  "Heal the NVMe-oF/TCP and iSCSI paths of volumes another CSI driver attached",
		synopsis: []string{"companion [flags]"},
		description: `Run beside another CSI driver's node plugin, with no CSI socket: every
--monitor-interval read sysfs, learn every NVMe/TCP subsystem's endpoints and
the connect options the kernel publishes for them (kept in --state-dir), and
heal every subsystem and iSCSI session on the node under the same policy,
verdict lines, metrics and /healthz as serve. It starts in --heal=observe; in
repair mode each action kind runs only when its flag enables it. Targets a
pathmend node plugin staged (a record in --state-dir names them) are left to
the plugin. docs/companion.md is the runbook.`,
		groups: []flagGroup{
			{"Node state flags", []string{"sys-root", "dev-root", "state-dir"}},
			{"Healing flags", []string{"heal", "monitor-interval", "kernel-events", "heal-grace", "heal-cooldown", "heal-max-scope", "connect-timeout"}},
			{"Companion action flags", []string{"nvme-reconnect", "nvme-repairs", "iscsi-relogin", "iscsid-restart", "forget-after"}},
			{"iSCSI flags", []string{"iscsi-stuck-threshold", "iscsid-restart-cooldown", "iscsid-restart-command", "host-command-prefix", "host-mountinfo"}},
			{"Metrics flags", []string{"metrics-address"}},
			{"Logging flags", []string{"logging-format", "v", "vmodule"}},
		},
		exitCodes: []exitCode{
			{0, "stopped by SIGTERM or SIGINT"},
			{1, "a flag value is invalid, or running failed (state dir, metrics listener)"},
			{2, "bad usage: an unknown flag or a stray argument"},
		},
		run: runCompanion,
	}
}

func defaultCompanionFlags() companionFlags {
	return companionFlags{forgetAfter: companion.DefaultForgetAfter}
}

func runCompanion(c *command, args []string, stdout, stderr io.Writer) int {
	fs := c.newFlagSet()
	cfg := defaultServeConfig()
	cfg.heal = string(heal.ModeObserve)
	shared := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.bindFlags(shared)
	for _, name := range companionShared {
		f := shared.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
		fs.Lookup(name).DefValue = f.DefValue
	}
	cf := defaultCompanionFlags()
	cf.bindNVMe(fs)
	cf.bindISCSI(fs)
	logFormat := bindLogFlags(fs)
	if code, done := c.parse(fs, args, stdout, stderr); done {
		return code
	}
	if code, done := startLogging(c, fs, *logFormat, stderr); done {
		return code
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runCompanionMode(ctx, cfg, cf); err != nil {
		klog.ErrorS(err, "pathmend companion failed")
		return 1
	}
	return 0
}

// validate checks companion mode's own flags.
func (c companionFlags) validate() error {
	if c.forgetAfter <= 0 {
		return errors.New("--forget-after must be positive")
	}
	return nil
}

// runCompanionMode builds every seam once and runs the loop in the
// foreign scope — the NVMe heal of learned subsystems, the iSCSI heal of
// sessions no record names — and the metrics listener until ctx ends. It
// never serves CSI, and never reconciles or repairs what the node
// plugin's records name.
func runCompanionMode(ctx context.Context, c serveConfig, cf companionFlags) error {
	if err := errors.Join(c.validate(), cf.validate()); err != nil {
		return err
	}
	ns, err := newNodeSeams(c)
	if err != nil {
		return err
	}
	mode, store, m, policy, sys, clk, owner, connector := ns.mode, ns.store, ns.metrics, ns.policy, ns.sys, ns.clk, ns.owner, ns.connector
	learner, err := newLearner(c, cf, sys)
	if err != nil {
		return err
	}
	nvmeTr, err := nvmeheal.New(nvmeheal.Config{Foreign: learner, Actions: cf.actions, ConnectTimeout: c.connectTimeout},
		nvmeheal.Deps{SysFS: sys, Policy: policy, Connector: connector, Prober: nvmeheal.TCPProber{Timeout: 2 * time.Second}, Clock: clk})
	if err != nil {
		return err
	}
	ex := exec.New()
	init, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: m.CountingExec(ex), Sys: sys, Writer: ns.writer, CommandPrefix: strings.Fields(c.hostCommandPrefix), RestartCommand: strings.Fields(c.iscsidRestartCommand)})
	if err != nil {
		return err
	}
	disabled := map[iscsi.Kick]string{}
	if !cf.actions.ISCSIRelogin {
		disabled[iscsi.KickRelogin] = "--iscsi-relogin"
	}
	if !cf.actions.ISCSIRestart {
		disabled[iscsi.KickRestart] = "--iscsid-restart"
	}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Policy: policy, Scope: iscsi.HealForeign, Disabled: disabled, Threshold: c.iscsiStuckThreshold,
		RestartCooldown: c.iscsidRestartCooldown, Stamps: store, Now: clk.Now,
		Kicker: init, Prober: &iscsi.NetProber{}, Use: ns.use,
	})
	if err != nil {
		return err
	}
	iscsiTr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sys, Healer: healer, Metrics: m, Clock: clk})
	if err != nil {
		return err
	}
	events, eventTasks := kernelEvents(c.kernelEvents && mode != heal.ModeOff, m)
	mon, err := monitor.New(monitor.Config{Interval: c.monitorInterval, Scope: monitor.Scope{Foreign: true}}, monitor.Deps{
		Intents: owner, Transports: []monitor.Transport{nvmeTr, iscsiTr}, Model: ns.model, Policy: policy,
		Metrics: m, Clock: clk, SysFS: sys, Events: events,
	})
	if err != nil {
		return err
	}
	klog.InfoS("Companion mode started", "mode", mode, "nvmeReconnect", cf.actions.NVMeReconnect, "nvmeRepairs", cf.actions.NVMeRepairs,
		"iscsiRelogin", cf.actions.ISCSIRelogin, "iscsidRestart", cf.actions.ISCSIRestart, "learned", len(learner.Learned()))

	// Until the context ends, whatever runs: with healing off and no
	// metrics address there is nothing else to wait for.
	tasks := []task{{"companion", func(ctx context.Context) error { <-ctx.Done(); return nil }}}
	if mode != heal.ModeOff {
		tasks = append(tasks, task{"monitor", mon.Run})
		tasks = append(tasks, eventTasks...)
	}
	if c.metricsAddress != "" {
		tasks = append(tasks, task{"metrics", func(ctx context.Context) error {
			return metrics.Serve(ctx, c.metricsAddress, m, tickCheck(ns.model, mode, 3*c.monitorInterval+c.connectTimeout))
		}})
	}
	return runTasks(ctx, tasks)
}

// newLearner builds the foreign scope's learned endpoints on the state
// dir's learned store.
func newLearner(c serveConfig, cf companionFlags, sys sysfs.FS) (*companion.Learner, error) {
	learned, err := companion.NewStore(c.stateDir)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	return companion.NewLearner(sys, learned, cf.forgetAfter)
}

// tickCheck is companion mode's /healthz, and serve's after its Probe:
// the loop finished a tick within maxAge, as the node model says (unless
// healing is off). There is no CSI server to probe.
func tickCheck(m *model.Model, mode heal.Mode, maxAge time.Duration) metrics.HealthCheck {
	return func(context.Context) error {
		if mode == heal.ModeOff {
			return nil
		}
		last := m.Snapshot().Ticked
		if last.IsZero() {
			return errors.New("monitor has not finished a tick yet")
		}
		if age := time.Since(last); age > maxAge {
			return fmt.Errorf("last monitor tick ended %s ago", age.Round(time.Second))
		}
		return nil
	}
}
