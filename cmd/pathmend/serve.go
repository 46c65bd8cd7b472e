package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	mount "k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/sysfs"
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
	shutdownTimeout   time.Duration
}

func defaultServeConfig() serveConfig {
	host, _ := os.Hostname()
	return serveConfig{
		endpoint:        "unix:///csi/csi.sock",
		nodeID:          host,
		driverName:      "csi.pathmend.io",
		sysRoot:         "/sys",
		devRoot:         "/dev",
		stateDir:        "/var/lib/pathmend",
		heal:            string(heal.ModeRepair),
		defaultFSType:   "ext4",
		shutdownTimeout: 30 * time.Second,
	}
}

func (c *serveConfig) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoint, "endpoint", c.endpoint, "CSI endpoint (unix socket) kubelet connects to")
	fs.StringVar(&c.nodeID, "node-id", c.nodeID, "node ID reported by NodeGetInfo (default: the hostname)")
	fs.StringVar(&c.driverName, "driver-name", c.driverName, "CSI driver name")
	fs.StringVar(&c.sysRoot, "sys-root", c.sysRoot, "root of the sysfs tree kernel state is read from")
	fs.StringVar(&c.devRoot, "dev-root", c.devRoot, "root of the device tree (nvme-fabrics, block devices)")
	fs.StringVar(&c.stateDir, "state-dir", c.stateDir, "directory of the staged-volume records")
	fs.StringVar(&c.heal, "heal", c.heal, "path healing: repair (act), observe (decide and log only) or off")
	fs.Int64Var(&c.maxVolumesPerNode, "max-volumes-per-node", c.maxVolumesPerNode, "volume limit reported to the scheduler; 0 means no limit")
	fs.StringVar(&c.topologyKey, "topology-key", c.topologyKey, "topology segment key reported by NodeGetInfo (off when empty)")
	fs.StringVar(&c.topologyValue, "topology-value", c.topologyValue, "topology segment value reported with --topology-key")
	fs.StringVar(&c.defaultFSType, "default-fs-type", c.defaultFSType, "filesystem created when a volume names none: ext4, ext3 or xfs")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", c.shutdownTimeout, "how long in-flight RPCs may run after SIGTERM")
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
	if c.shutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive"))
	}
	for flagName, dir := range map[string]string{"--sys-root": c.sysRoot, "--dev-root": c.devRoot, "--state-dir": c.stateDir} {
		if dir == "" {
			errs = append(errs, fmt.Errorf("%s is empty", flagName))
		}
	}
	return errors.Join(errs...)
}

// serve builds every OS seam once, wires the driver and runs it until ctx
// ends.
func serve(ctx context.Context, c serveConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	mode, _ := heal.ParseMode(c.heal)
	store, err := volume.NewStore(c.stateDir)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	ex := exec.New()
	d, err := driver.New(driver.Config{
		DriverName:        c.driverName,
		Version:           version,
		NodeID:            c.nodeID,
		MaxVolumesPerNode: c.maxVolumesPerNode,
		TopologyKey:       c.topologyKey,
		TopologyValue:     c.topologyValue,
		HealMode:          mode,
		DefaultFSType:     c.defaultFSType,
	}, driver.Deps{
		SysFS:   sysfs.New(c.sysRoot),
		Store:   store,
		Mounter: mount.NewSafeFormatAndMount(mount.New(""), ex),
		Exec:    ex,
		Attachers: map[volume.Transport]driver.Attacher{
			volume.TransportNVMeTCP: driver.NotBuilt(volume.TransportNVMeTCP),
			volume.TransportISCSI:   driver.NotBuilt(volume.TransportISCSI),
		},
		Now: time.Now,
	})
	if err != nil {
		return err
	}
	return d.Run(ctx, c.endpoint, c.shutdownTimeout)
}
