package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	mount "k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	iscsiattach "github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/monitor"
	nvmeattach "github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// serveConfig is every flag of `pathmend serve`.
type serveConfig struct {
	endpoint          string
	nodeID            string
	driverName        string
	sysRoot           string
	devRoot           string
	stateDir          string
	heal              string
	maxVolumesPerNode int64
	topologyKey       string
	topologyValue     string
	defaultFSType     string
	kubeletRoot       string
	shutdownTimeout   time.Duration

	metricsAddress  string
	monitorInterval time.Duration
	kernelEvents    bool
	connectTimeout  time.Duration
	backoffMax      time.Duration
	attachTimeout   time.Duration
	healGrace       time.Duration
	healCooldown    time.Duration
	healMaxScope    string
	hostNQNFile     string
	hostIDFile      string

	hostCommandPrefix     string
	iscsidRestartCommand  string
	iscsiHealScope        string
	iscsiStuckThreshold   time.Duration
	iscsidRestartCooldown time.Duration
	noMultipathd          bool
	hostMountInfo         string

	intentTimeout time.Duration

	kernelCallTimeout time.Duration
	xfsRepair         bool
	procRoot          string

	healForeign bool
	foreign     companionFlags
}

func defaultServeConfig() serveConfig {
	return serveConfig{
		endpoint:        "unix:///csi/csi.sock",
		driverName:      "csi.pathmend.io",
		sysRoot:         "/sys",
		devRoot:         "/dev",
		stateDir:        "/var/lib/pathmend",
		heal:            string(heal.ModeRepair),
		defaultFSType:   "ext4",
		kubeletRoot:     "/var/lib/kubelet",
		shutdownTimeout: 30 * time.Second,
		monitorInterval: 3 * time.Second,
		kernelEvents:    true,
		connectTimeout:  10 * time.Second,
		backoffMax:      nvmeheal.DefaultBackoffMax,
		attachTimeout:   15 * time.Second,
		healGrace:       heal.DefaultGrace,
		healCooldown:    heal.DefaultCooldown,
		healMaxScope:    "subsystem",
		hostNQNFile:     "/etc/nvme/hostnqn",
		hostIDFile:      "/etc/nvme/hostid",

		iscsidRestartCommand:  "systemctl restart iscsid",
		iscsiHealScope:        string(iscsi.HealStaged),
		iscsiStuckThreshold:   iscsi.DefaultThreshold,
		iscsidRestartCooldown: iscsi.DefaultRestartCooldown,
		hostMountInfo:         "/proc/1/mountinfo",

		intentTimeout: intent.DefaultTimeout,
		foreign:       defaultCompanionFlags(),

		kernelCallTimeout: driver.DefaultKernelCallTimeout,
		procRoot:          "/proc",
	}
}

func (c *serveConfig) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoint, "endpoint", c.endpoint, "CSI endpoint (unix socket) kubelet connects to")
	fs.StringVar(&c.nodeID, "node-id", c.nodeID, "node ID reported by NodeGetInfo (default: the node's hostname, read when serve starts)")
	fs.StringVar(&c.driverName, "driver-name", c.driverName, "CSI driver name")
	fs.StringVar(&c.sysRoot, "sys-root", c.sysRoot, "root of the sysfs tree kernel state is read from")
	fs.StringVar(&c.devRoot, "dev-root", c.devRoot, "root of the device tree (nvme-fabrics, block devices)")
	fs.StringVar(&c.stateDir, "state-dir", c.stateDir, "directory of the staged-volume records")
	fs.StringVar(&c.heal, "heal", c.heal, "path healing: repair (act), observe (decide and log only) or off")
	fs.Int64Var(&c.maxVolumesPerNode, "max-volumes-per-node", c.maxVolumesPerNode, "volume limit reported to the scheduler; 0 means no limit")
	fs.StringVar(&c.topologyKey, "topology-key", c.topologyKey, "topology segment key reported by NodeGetInfo (off when empty)")
	fs.StringVar(&c.topologyValue, "topology-value", c.topologyValue, "topology segment value reported with --topology-key")
	fs.StringVar(&c.defaultFSType, "default-fs-type", c.defaultFSType, "filesystem created when a volume names none: ext4, ext3 or xfs")
	fs.StringVar(&c.kubeletRoot, "kubelet-root", c.kubeletRoot, "kubelet's root directory: every staging, target and volume path a request names must be inside it (empty: any absolute path)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", c.shutdownTimeout, "how long in-flight RPCs may run after SIGTERM")
	fs.StringVar(&c.metricsAddress, "metrics-address", c.metricsAddress, "listen address of /metrics and /healthz, e.g. :9811 (off when empty)")
	fs.DurationVar(&c.monitorInterval, "monitor-interval", c.monitorInterval, "time between monitor ticks (plus up to 20% jitter); with --kernel-events the tick is the backstop for what the kernel does not announce")
	fs.BoolVar(&c.kernelEvents, "kernel-events", c.kernelEvents, "listen to the kernel's uevents (netlink, the kernel's group; no udev) and read and heal the target one names at once instead of at the next tick (docs/uevents.md)")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", c.connectTimeout, "bound of one NVMe-oF connect")
	fs.DurationVar(&c.backoffMax, "reconnect-backoff-max", c.backoffMax, "longest wait between reconnects of an NVMe-oF endpoint whose probe gets no answer or whose connect fails (refusals are retried every tick)")
	fs.DurationVar(&c.attachTimeout, "attach-timeout", c.attachTimeout, "how long NodeStage waits for a namespace after connecting")
	fs.DurationVar(&c.healGrace, "heal-grace", c.healGrace, "a teardown including a controller younger than this is deferred")
	fs.DurationVar(&c.healCooldown, "heal-cooldown", c.healCooldown, "a repaired defect key is left alone this long")
	fs.StringVar(&c.healMaxScope, "heal-max-scope", c.healMaxScope, "widest teardown a repair may do: controller or subsystem")
	fs.StringVar(&c.hostNQNFile, "hostnqn-file", c.hostNQNFile, "NVMe host NQN file; generated and persisted when absent")
	fs.StringVar(&c.hostIDFile, "hostid-file", c.hostIDFile, "NVMe host ID file; generated and persisted when absent")
	fs.StringVar(&c.hostCommandPrefix, "host-command-prefix", c.hostCommandPrefix, `prefix of every host command (iscsiadm, multipath, the iscsid restart), split on spaces; e.g. "nsenter --target 1 --mount --" from a container with hostPID`)
	fs.StringVar(&c.iscsidRestartCommand, "iscsid-restart-command", c.iscsidRestartCommand, "host command that restarts iscsid (the heal's last rung), split on spaces")
	fs.StringVar(&c.iscsiHealScope, "heal-iscsi-scope", c.iscsiHealScope, "iSCSI sessions the heal may kick: staged (targets of staged volumes) or all")
	fs.DurationVar(&c.iscsiStuckThreshold, "iscsi-stuck-threshold", c.iscsiStuckThreshold, "how long a session must be down with its portal continuously reachable before it is kicked")
	fs.DurationVar(&c.iscsidRestartCooldown, "iscsid-restart-cooldown", c.iscsidRestartCooldown, "at most one iscsid restart per node in this window (remembered in the state dir across restarts of pathmend)")
	fs.StringVar(&c.hostMountInfo, "host-mountinfo", c.hostMountInfo, "the host's mount table, read when the iSCSI heal must choose between a relogin and the iscsid restart for a LUN's last path: a LUN mounted, held or bound on the node is in use (unreadable or empty: every such LUN is)")
	fs.BoolVar(&c.noMultipathd, "no-multipathd", c.noMultipathd, "the node runs no multipathd: iSCSI attach uses one disk without waiting for a map")
	fs.BoolVar(&c.healForeign, "heal-foreign", c.healForeign, "also heal the NVMe/TCP subsystems other drivers connected (companion mode's NVMe pass: learn, reconnect what the kernel gave up with --nvme-reconnect, repair with --nvme-repairs); iSCSI sessions of other drivers are --heal-iscsi-scope=all")
	c.foreign.bindNVMe(fs)
	fs.DurationVar(&c.intentTimeout, "intent-timeout", c.intentTimeout, "an attaching volume with no RPC in flight for this long, whose device nothing uses, is rolled back (detached, its record removed)")
	fs.DurationVar(&c.kernelCallTimeout, "kernel-call-timeout", c.kernelCallTimeout, "how long an RPC waits for an unmount, statfs or filesystem grow that waits for the volume's I/O before it answers Aborted and leaves the call to finish in the kernel (nothing else is started on the volume meanwhile)")
	fs.BoolVar(&c.xfsRepair, "xfs-repair", c.xfsRepair, "let NodeStage run xfs_repair (never -L) on an XFS that does not mount and that xfs_repair -n finds damaged, then mount it once more")
	fs.StringVar(&c.procRoot, "proc-root", c.procRoot, "procfs root: ext4's options (fs/ext4/<dev>/options) and the node's unwritten-data counters (meminfo) are read under it")
}

// validate checks the flags that New does not see.
func (c serveConfig) validate() error {
	var errs []error
	if _, err := driver.ParseEndpoint(c.endpoint); err != nil {
		errs = append(errs, fmt.Errorf("--endpoint: %w", err))
	}
	if _, err := heal.ParseMode(c.heal); err != nil {
		errs = append(errs, fmt.Errorf("--heal: %w", err))
	}
	for name, d := range map[string]time.Duration{"--shutdown-timeout": c.shutdownTimeout, "--monitor-interval": c.monitorInterval,
		"--connect-timeout": c.connectTimeout, "--attach-timeout": c.attachTimeout, "--reconnect-backoff-max": c.backoffMax, "--heal-grace": c.healGrace, "--heal-cooldown": c.healCooldown,
		"--intent-timeout": c.intentTimeout, "--kernel-call-timeout": c.kernelCallTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if _, err := parseScope(c.healMaxScope); err != nil {
		errs = append(errs, fmt.Errorf("--heal-max-scope: %w", err))
	}
	if c.iscsiHealScope != string(iscsi.HealStaged) && c.iscsiHealScope != string(iscsi.HealAll) {
		errs = append(errs, fmt.Errorf("--heal-iscsi-scope %q: want staged or all", c.iscsiHealScope))
	}
	if len(strings.Fields(c.iscsidRestartCommand)) == 0 {
		errs = append(errs, errors.New("--iscsid-restart-command is empty"))
	}
	if c.iscsidRestartCooldown <= 0 {
		errs = append(errs, errors.New("--iscsid-restart-cooldown must be positive"))
	}
	if c.iscsiStuckThreshold <= 0 {
		errs = append(errs, errors.New("--iscsi-stuck-threshold must be positive"))
	}
	if c.healForeign {
		errs = append(errs, c.foreign.validate())
	}
	for flagName, dir := range map[string]string{"--sys-root": c.sysRoot, "--dev-root": c.devRoot, "--state-dir": c.stateDir} {
		if dir == "" {
			errs = append(errs, fmt.Errorf("%s is empty", flagName))
		}
	}
	return errors.Join(errs...)
}

// parseScope validates --heal-max-scope.
func parseScope(s string) (heal.Scope, error) {
	switch s {
	case "controller":
		return heal.ScopeController, nil
	case "subsystem":
		return heal.ScopeSubsystem, nil
	}
	return 0, fmt.Errorf("%q: want controller or subsystem", s)
}

// serve builds every OS seam once, wires the transports, the driver,
// the loop and the metrics listener around one node model, and runs them
// until ctx ends.
func serve(ctx context.Context, c serveConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	ns, err := newNodeSeams(c)
	if err != nil {
		return err
	}
	mode, store, m, policy, sys, clk, owner, connector := ns.mode, ns.store, ns.metrics, ns.policy, ns.sys, ns.clk, ns.owner, ns.connector
	host, err := fabrics.LoadOrCreateHostIdentity(c.hostNQNFile, c.hostIDFile)
	if err != nil {
		return fmt.Errorf("NVMe host identity: %w", err)
	}
	var learner *companion.Learner
	if c.healForeign {
		if learner, err = newLearner(c, c.foreign, sys); err != nil {
			return err
		}
	}
	nvmeTr, err := nvmeheal.New(nvmeheal.Config{Owned: true, Foreign: learner, Actions: c.foreign.actions, ConnectTimeout: c.connectTimeout, BackoffMax: c.backoffMax},
		nvmeheal.Deps{SysFS: sys, Policy: policy, Connector: connector, Host: host, Prober: nvmeheal.TCPProber{Timeout: 2 * time.Second}, Clock: clk})
	if err != nil {
		return err
	}
	nvmeAtt, err := nvmeattach.NewAttacher(nvmeattach.AttacherConfig{
		SysFS: sys, DevRoot: c.devRoot, Connector: connector, Host: host, Mender: nvmeTr, Clock: clk,
		AttachWait: c.attachTimeout, ConnectTimeout: c.connectTimeout,
	})
	if err != nil {
		return err
	}
	ex := exec.New()
	prefix := strings.Fields(c.hostCommandPrefix)
	restart := strings.Fields(c.iscsidRestartCommand)
	// One initiator: NodeStage's, and a view of it for the heal whose
	// commands count in pathmend_monitor_processes_started_total. Both
	// share one gate, so an iscsid restart never runs during a login or
	// logout of either, and one lock per node record.
	stageInit, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: ex, Sys: sys, Writer: ns.writer, CommandPrefix: prefix, RestartCommand: restart})
	if err != nil {
		return err
	}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Policy: policy, Scope: iscsi.HealScope(c.iscsiHealScope), Threshold: c.iscsiStuckThreshold,
		RestartCooldown: c.iscsidRestartCooldown, Stamps: store, Now: clk.Now,
		Kicker: stageInit.WithExec(m.CountingExec(ex)), Use: ns.use, Prober: &iscsi.NetProber{},
	})
	if err != nil {
		return err
	}
	iscsiTr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sys, Healer: healer, Metrics: m, Clock: clk})
	if err != nil {
		return err
	}
	iscsiAtt, err := iscsiattach.NewAttacher(iscsiattach.AttacherConfig{
		Sys: sys, Writer: ns.writer, DevRoot: c.devRoot, Initiator: stageInit, Clocks: healer, NoMultipathd: c.noMultipathd, Clock: clk,
	})
	if err != nil {
		return err
	}
	mounter := mount.NewSafeFormatAndMount(mount.New(""), ex)
	reconciler, err := intent.NewReconciler(intent.ReconcilerConfig{Timeout: c.intentTimeout, Observe: mode == heal.ModeObserve}, intent.ReconcilerDeps{
		Owner: owner, Mounts: mounter, SysFS: sys, Clock: clk,
		Detachers: map[volume.Transport]intent.Detacher{volume.TransportNVMeTCP: nvmeAtt, volume.TransportISCSI: iscsiAtt},
	})
	if err != nil {
		return err
	}
	loop := monitor.Config{Interval: c.monitorInterval, Scope: monitor.Scope{Owned: true, Foreign: c.healForeign}}
	// The driver writes a volume it staged into the model through the
	// loop, which is built after it (it reads the driver's staged devices).
	var staged stagedRefresher
	d, err := driver.New(driver.Config{
		DriverName:        c.driverName,
		Version:           buildVersion(),
		NodeID:            c.nodeID,
		MaxVolumesPerNode: c.maxVolumesPerNode,
		TopologyKey:       c.topologyKey,
		TopologyValue:     c.topologyValue,
		HealMode:          mode,
		DefaultFSType:     c.defaultFSType,
		KubeletRoot:       c.kubeletRoot,
		KernelCallTimeout: c.kernelCallTimeout,
		XFSRepair:         c.xfsRepair,
		HealthBound:       loop.Bound(),
	}, driver.Deps{
		SysFS:       sys,
		Filesystems: fshealth.New(sys, c.procRoot, nil),
		Intents:     owner,
		Mounter:     mounter,
		Exec:        ex,
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: nvmeAtt,
			volume.TransportISCSI:   iscsiAtt,
		},
		Clock:     clk,
		Model:     ns.model,
		Refresher: &staged,
	})
	if err != nil {
		return err
	}
	events, eventTasks := kernelEvents(c.kernelEvents && mode != heal.ModeOff, m)
	mon, err := monitor.New(loop, monitor.Deps{
		Intents: owner, Transports: []monitor.Transport{nvmeTr, iscsiTr}, Model: ns.model, Policy: policy,
		Reconciler: reconciler, Metrics: m, Clock: clk, SysFS: sys, Staged: d.StagedDevices, Events: events,
		Filesystems: d.FilesystemHealth,
	})
	if err != nil {
		return err
	}
	staged.mon = mon

	var check metrics.HealthCheck
	if c.metricsAddress != "" {
		var closeCheck func()
		check, closeCheck, err = healthCheck(c.endpoint, ns.model, mode, 3*c.monitorInterval+c.connectTimeout)
		if err != nil {
			return err
		}
		defer closeCheck()
	}

	tasks := []task{{"csi server", func(ctx context.Context) error { return d.Run(ctx, c.endpoint, c.shutdownTimeout) }}}
	if mode != heal.ModeOff {
		tasks = append(tasks, task{"monitor", mon.Run})
		tasks = append(tasks, eventTasks...)
	}
	if c.metricsAddress != "" {
		tasks = append(tasks, task{"metrics", func(ctx context.Context) error { return metrics.Serve(ctx, c.metricsAddress, m, check) }})
	}
	return runTasks(ctx, tasks)
}

// task is one long-running part of a command.
type task struct {
	name string
	run  func(context.Context) error
}

// runTasks runs every task in its own goroutine and returns when all have
// returned. The first to fail cancels the others' context, and its error
// (named after the task) is the result.
func runTasks(ctx context.Context, tasks []task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(tasks))
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t.run(ctx); err != nil {
				errc <- fmt.Errorf("%s: %w", t.name, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// stagedRefresher hands the driver's staged volumes to the loop once it is
// built (before the CSI server serves).
type stagedRefresher struct{ mon *monitor.Monitor }

func (s *stagedRefresher) RefreshStaged(ctx context.Context, rec volume.Record) error {
	if s.mon == nil {
		return nil
	}
	return s.mon.RefreshStaged(ctx, rec)
}
