package driver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	mount "k8s.io/mount-utils"
	"k8s.io/utils/clock"
	"k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Config is the driver's identity and node facts, parsed from flags.
type Config struct {
	// DriverName is the CSI driver name, e.g. csi.pathmend.io.
	DriverName string
	// Version is stamped into the binary at build time.
	Version string
	// NodeID is reported by NodeGetInfo; the node's hostname by default.
	NodeID string
	// MaxVolumesPerNode is reported by NodeGetInfo; 0 means no limit.
	MaxVolumesPerNode int64
	// TopologyKey and TopologyValue, when both set, make NodeGetInfo
	// report an accessible topology segment {key: value}.
	TopologyKey   string
	TopologyValue string
	// HealMode is the validated --heal flag.
	HealMode heal.Mode
	// DefaultFSType is formatted when a mount capability names no
	// filesystem; ext4 when empty.
	DefaultFSType string
	// HealthBound is how old, at most, a volume's entry in the node model
	// may be for the health RPCs to answer from it: the loop's bound (two
	// ticks, monitor.Config.Bound). An older or missing entry makes the
	// RPC read the volume's own kernel objects. Zero: never from the
	// model.
	HealthBound time.Duration
	// KubeletRoot, when set, confines every path a request carries
	// (staging, target and volume paths) to this directory and below:
	// kubelet's root directory, /var/lib/kubelet by default. Empty
	// accepts any absolute path.
	KubeletRoot string
	// KernelCallTimeout bounds how long an RPC waits for a call into the
	// kernel that waits for a volume's I/O (an unmount, a statfs, a
	// filesystem grow) before it answers Aborted and leaves the call to
	// finish on its own; DefaultKernelCallTimeout when zero.
	KernelCallTimeout time.Duration
	// XFSRepair lets NodeStage run xfs_repair (never with -L) on an XFS
	// whose mount failed because its metadata needs repair, then mount
	// once more. Off by default: a repair changes the filesystem, and
	// whether to run it is the operator's call.
	XFSRepair bool
}

// DefaultKernelCallTimeout is the default Config.KernelCallTimeout:
// seconds, not the minutes a flush to a device without a path can take.
const DefaultKernelCallTimeout = 10 * time.Second

// Deps are the OS seams the driver works through. main builds each exactly
// once; tests pass real ones rooted in temp dirs.
type Deps struct {
	// SysFS is the sysfs tree the node is read from.
	SysFS sysfs.FS
	// Intents is the node's intent owner: it keeps the staged-volume
	// records, admits one operation per volume and leases targets. The
	// monitor and the iSCSI heal share it.
	Intents *intent.Owner
	// Mounter formats and mounts; its Exec runs mkfs, fsck and blkid.
	Mounter *mount.SafeFormatAndMount
	// Exec runs the filesystem resize tools.
	Exec exec.Interface
	// Attachers maps every transport the parser knows to its Attacher.
	Attachers map[volume.Transport]Attacher
	// Clock is the clock; clock.RealClock in production.
	Clock clock.Clock
	// Filesystems reads the health of staged filesystems (ext4's error
	// record, XFS's shutdown); one over SysFS, /proc and stat(2) when nil.
	Filesystems *fshealth.Reader
	// MountInfo, when set and MountTable is not, is the mount table as a
	// test has it: every mount with its ID, its parent's, its device
	// number, root, source, filesystem type and options; a table is
	// built from it at every call.
	MountInfo func() ([]mount.MountInfo, error)
	// MountTable returns the mount table — every mount with its ID, its
	// parent's, its device number, root, source, filesystem type and
	// options — as the ownership checks (layers.go), the filesystem
	// health and the staged-device checks read it. A *Table is never
	// changed; the same one may be returned while nothing was mounted,
	// moved, remounted or unmounted. When nil: a mounts.Kept of
	// /proc/self/mountinfo when MountInfo is nil too (read again only
	// after the kernel signals a change: one poll(2) per call on a quiet
	// node), else a table built from MountInfo at every call.
	MountTable func() (*mounts.Table, error)
	// UnmountLayer unmounts one layer of the mount table, and only when it
	// is on top of its mount point: NodeUnpublish, NodeUnstage and every
	// rollback unmount through it, never by path alone. mounts.Unmount
	// when nil.
	UnmountLayer func(mounts.Layer) error
	// MountNamespace says which mount namespace of which boot the mount
	// IDs MountInfo reads are valid in; mounts.CurrentNamespace when nil.
	MountNamespace func() (mounts.Namespace, error)
	// Logger receives the driver's log lines: the gRPC interceptor puts
	// it into every call's context, and the handlers log through
	// klog.FromContext. klog's own logger when zero; tests pass one
	// that writes to their own sink.
	Logger logr.Logger
	// Model, when set, is the node model the loop keeps: the health RPCs
	// answer from it (Config.HealthBound), and NodeGetStorageHealth adds
	// the node-wide conditions of the loop's last tick (targets and
	// portals that do not answer, iSCSI sessions the heal cannot kick),
	// Degraded as STORAGE_DEGRADED, Inaccessible as STORAGE_UNREACHABLE.
	// Without it every health RPC reads its volume's own kernel objects.
	Model *model.Model
	// Refresher, when set, writes a volume NodeStageVolume staged into
	// the model at once (the loop, pkg/monitor), so that a kernel event
	// naming one of its objects finds it before the next tick.
	Refresher StagedRefresher
}

// StagedRefresher writes a volume staged just now into the node model:
// its target's kernel objects read again, with the device its users
// hold. An error is logged; the next tick writes the volume anyway.
type StagedRefresher interface {
	RefreshStaged(ctx context.Context, rec volume.Record) error
}

// Driver serves the CSI Identity and Node services of one node.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer

	cfg   Config
	deps  Deps
	locks *volumeLocks
	// calls are the kernel calls that may wait for a volume's I/O, at
	// most one per volume, each waited for at most KernelCallTimeout.
	calls *kernelCalls
	// derived is the last mount table read and what was derived from it
	// (readMountTable).
	derived atomic.Pointer[derivedTable]
}

var (
	_ csi.IdentityServer = (*Driver)(nil)
	_ csi.NodeServer     = (*Driver)(nil)
)

// New validates cfg and deps and returns a Driver. It touches nothing on
// the host.
func New(cfg Config, deps Deps) (*Driver, error) {
	var errs []error
	if cfg.DriverName == "" {
		errs = append(errs, errors.New("driver name is empty"))
	}
	if cfg.NodeID == "" {
		errs = append(errs, errors.New("node ID is empty"))
	}
	if n := len(cfg.NodeID); n > maxNodeIDBytes {
		errs = append(errs, fmt.Errorf("node ID is %d bytes; the CSI limit is %d", n, maxNodeIDBytes))
	}
	if cfg.MaxVolumesPerNode < 0 {
		errs = append(errs, fmt.Errorf("max volumes per node %d is negative", cfg.MaxVolumesPerNode))
	}
	if (cfg.TopologyKey == "") != (cfg.TopologyValue == "") {
		errs = append(errs, errors.New("topology key and value must be set together"))
	} else if cfg.TopologyKey != "" {
		if err := checkTopology(cfg.TopologyKey, cfg.TopologyValue); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := heal.ParseMode(string(cfg.HealMode)); err != nil {
		errs = append(errs, err)
	}
	if deps.SysFS.Root() == "" {
		errs = append(errs, errors.New("sysfs root is not set"))
	}
	if deps.Intents == nil {
		errs = append(errs, errors.New("intent owner is not set"))
	}
	if deps.Mounter == nil || deps.Mounter.Interface == nil || deps.Mounter.Exec == nil {
		errs = append(errs, errors.New("mounter is not set"))
	}
	if deps.Exec == nil {
		errs = append(errs, errors.New("exec is not set"))
	}
	for _, t := range volume.Transports {
		if deps.Attachers[t] == nil {
			errs = append(errs, fmt.Errorf("no attacher for transport %q", t))
		}
	}
	if cfg.HealthBound < 0 {
		errs = append(errs, fmt.Errorf("health bound %s is negative", cfg.HealthBound))
	}
	if cfg.DefaultFSType == "" {
		cfg.DefaultFSType = defaultFSType
	}
	if !supportedFSTypes[cfg.DefaultFSType] {
		errs = append(errs, fmt.Errorf("default filesystem %q is not supported; use ext4, ext3 or xfs", cfg.DefaultFSType))
	}
	if cfg.KubeletRoot != "" {
		if !filepath.IsAbs(cfg.KubeletRoot) {
			errs = append(errs, fmt.Errorf("kubelet root %q is not an absolute path", cfg.KubeletRoot))
		}
		cfg.KubeletRoot = filepath.Clean(cfg.KubeletRoot)
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Filesystems == nil && deps.SysFS.Root() != "" {
		deps.Filesystems = fshealth.New(deps.SysFS, "/proc", nil)
	}
	if cfg.KernelCallTimeout < 0 {
		errs = append(errs, fmt.Errorf("kernel call timeout %s is negative", cfg.KernelCallTimeout))
	}
	if cfg.KernelCallTimeout == 0 {
		cfg.KernelCallTimeout = DefaultKernelCallTimeout
	}
	if deps.MountTable == nil {
		if deps.MountInfo == nil {
			deps.MountTable = mounts.NewKept(mounts.SelfMountInfo).Table
		} else {
			info := deps.MountInfo
			deps.MountTable = func() (*mounts.Table, error) {
				infos, err := info()
				if err != nil {
					return nil, err
				}
				return mounts.NewTable(infos), nil
			}
		}
	}
	if deps.UnmountLayer == nil {
		deps.UnmountLayer = mounts.Unmount
	}
	if deps.MountNamespace == nil {
		deps.MountNamespace = mounts.CurrentNamespace
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	calls := newKernelCalls(deps.Clock, cfg.KernelCallTimeout)
	return &Driver{cfg: cfg, deps: deps, locks: &volumeLocks{owner: deps.Intents, calls: calls}, calls: calls}, nil
}

// attacher returns the Attacher of transport t.
func (d *Driver) attacher(t volume.Transport) (Attacher, error) {
	a, ok := d.deps.Attachers[t]
	if !ok {
		known := make([]string, 0, len(d.deps.Attachers))
		for k := range d.deps.Attachers {
			known = append(known, string(k))
		}
		sort.Strings(known)
		return nil, invalidArgument("volume context key \"transport\": unknown transport %q; known: %v", t, known)
	}
	return a, nil
}
