package attach

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Mender runs the repair step of the NVMe job on one subsystem
// (*nvmeheal.Transport).
type Mender interface {
	Mend(ctx context.Context, m nvmeheal.Mend) (nvmeheal.Mended, error)
}

// ErrNoPath: not one endpoint of the volume could be connected.
var ErrNoPath = errors.New("no path to the volume could be connected")

// AttacherConfig configures the NVMe/TCP attacher.
type AttacherConfig struct {
	SysFS sysfs.FS
	// DevRoot is where block device nodes live ("/dev").
	DevRoot   string
	Connector nvme.Connector
	Host      fabrics.HostIdentity
	// Mender is the NVMe transport's repair step (*nvmeheal.Transport):
	// the attach-time repair is the NVMe job's, run under the lease the
	// NodeStage holds, through the process's one heal policy.
	Mender Mender
	// Clock times the waits for a namespace and a resize; the real clock
	// when nil.
	Clock clock.Clock
	// AttachWait bounds the wait for the namespace head after connecting
	// (default 15 s); ConnectTimeout bounds one connect (default 30 s).
	AttachWait     time.Duration
	ConnectTimeout time.Duration
	// Poll is the sysfs poll interval while waiting (default 100 ms).
	Poll time.Duration
}

// Attacher attaches NVMe-oF/TCP volumes: connect every endpoint through
// the kernel's fabrics interface, find the namespace by identity in sysfs,
// and when it does not show up or diagnosis finds a defect on its
// subsystem, run one repair through the policy and retry the connect once.
// It implements the driver's Attacher through pkg/volume types.
type Attacher struct {
	cfg AttacherConfig
	// reader remembers the address of every controller it has seen
	// live, which is not read while a controller is not. Every read is of
	// the volume's own subsystem (ReadTarget): what one volume's attach,
	// detach or health costs does not grow with the node.
	reader *nvme.Reader
}

// NewAttacher validates cfg and fills in defaults.
func NewAttacher(cfg AttacherConfig) (*Attacher, error) {
	if cfg.Connector == nil || cfg.Mender == nil || cfg.DevRoot == "" || cfg.SysFS.Root() == "" {
		return nil, errors.New("nvme attacher: sysfs, dev root, connector and mender are required")
	}
	if cfg.Host.NQN == "" || cfg.Host.ID == "" {
		return nil, errors.New("nvme attacher: host NQN and host ID are required")
	}
	if cfg.AttachWait <= 0 {
		cfg.AttachWait = 15 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 30 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Attacher{cfg: cfg, reader: nvme.NewReader(cfg.SysFS, nvme.ScopeAll)}, nil
}

// created is what one Attach call connected: controller names of one
// subsystem, in connect order.
type created struct {
	nqn   string
	ctrls []string
}

func (c *created) String() string { return "controllers " + strings.Join(c.ctrls, ",") }

// createdOf wraps the controllers a call connected; nil when none.
func createdOf(nqn string, ctrls []string) volume.Created {
	if len(ctrls) == 0 {
		return nil
	}
	return &created{nqn: nqn, ctrls: slices.Clone(ctrls)}
}

// Attach connects the volume's paths and returns its verified device and
// the controllers this call connected. When it fails, the attachment
// still names the controllers it connected, for Undo: a failed NodeStage
// leaves no half-attached volume behind. The repair it may run spares
// req.CoTenants (sysfs shows their namespaces) and tears nothing down
// while req.CoTenants.Err is set. Errors a later retry may not have wrap
// volume.ErrUnavailable.
func (a *Attacher) Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	att := volume.Attachment{VolumeID: req.VolumeID, Context: req.Context}
	n := req.Context.NVMe
	if n == nil {
		return att, errors.New("nvme attacher: volume context is not nvme-tcp")
	}
	if w := nvme.ShortCtrlLossTmo(n); w != "" {
		klog.FromContext(ctx).Info("Volume context sets a short ctrlLossTmo", "volumeID", req.VolumeID, "nqn", n.NQN, "reason", w)
	}
	exp := nvme.ExpectationOf(req.VolumeID, n)
	created, err := a.connectOnce(ctx, n, req.Secrets)
	att.Created = createdOf(n.NQN, created)
	if err != nil {
		return att, fmt.Errorf("%w: %w", volume.ErrUnavailable, err)
	}
	dev, locErr := a.waitDevice(ctx, exp)
	defects, err := a.defectsOf(exp)
	if err != nil {
		return att, err
	}
	if locErr == nil && len(defects) == 0 {
		att.Device = dev
		return att, nil
	}
	// The "already connected but unusable" state: connecting again
	// changes nothing, so repair once through the policy, then connect
	// once more and look again.
	level := klog.Level(0)
	if locErr == nil {
		level = 2 // usable already: the repair is about a path, not the stage
	}
	klog.FromContext(ctx).V(int(level)).Info("Volume not fully usable after connect; trying one repair", "volumeID", req.VolumeID, "nqn", n.NQN, "lookup", errString(locErr), "defects", len(defects))
	// The repair is the NVMe job's own repair step, on the one subsystem
	// whose lease this NodeStage holds: it diagnoses again on a fresh read
	// and spares the co-tenants sysfs shows.
	m := nvmeheal.Mend{NQN: n.NQN, Expect: []nvme.Expectation{exp}, Concern: &exp}
	if err := req.CoTenants.Err(); err != nil {
		m.Blocked = err.Error()
	}
	mended, err := a.cfg.Mender.Mend(ctx, m)
	if err != nil {
		return att, fmt.Errorf("repair %s: %w", n.NQN, err)
	}
	outs := mended.Outcomes
	for _, o := range outs {
		for _, p := range o.Removed {
			created = slices.DeleteFunc(created, func(c string) bool { return c == p.Name })
		}
	}
	more, err := a.connectOnce(ctx, n, req.Secrets)
	created = append(created, more...)
	att.Created = createdOf(n.NQN, created)
	if err != nil {
		return att, fmt.Errorf("%w: %w (after %s)", volume.ErrUnavailable, err, summarize(outs))
	}
	dev, locErr = a.waitDevice(ctx, exp)
	if locErr != nil {
		return att, fmt.Errorf("%w: volume %s: %w (after %s)", volume.ErrUnavailable, req.VolumeID, locErr, summarize(outs))
	}
	att.Device = dev
	return att, nil
}

// Undo disconnects the controllers one Attach connected (att.Created) and
// nothing else, unless a co-tenant record names the subsystem (they are
// its paths too, or will be). A controller that is gone, or whose name
// the kernel has given to another subsystem's controller since, is left
// alone. It returns an error when a controller it should remove stays:
// co.Err forbids any teardown, or a disconnect failed.
func (a *Attacher) Undo(ctx context.Context, att volume.Attachment, co volume.CoTenants) error {
	c, _ := att.Created.(*created)
	if c == nil || len(c.ctrls) == 0 {
		return nil
	}
	if err := co.Err(); err != nil {
		return fmt.Errorf("keep %s of %s: %w", c, c.nqn, err)
	}
	if users := co.IDs(); len(users) > 0 {
		klog.FromContext(ctx).Info("Undo leaves the controllers it connected: other volumes use the subsystem", "volumeID", att.VolumeID, "nqn", c.nqn, "controllers", strings.Join(c.ctrls, ","), "volumes", strings.Join(users, ","))
		return nil
	}
	h, err := a.reader.ReadTarget(c.nqn)
	if err != nil {
		return fmt.Errorf("undo attach of %s: %w", att.VolumeID, err)
	}
	var errs []error
	for _, name := range c.ctrls {
		ctrl, ok := h.Controller(nvme.ControllerName(name))
		if !ok || ctrl.SubsysNQN != c.nqn {
			continue // gone, or the name is another subsystem's now
		}
		if err := a.cfg.Connector.Disconnect(name); err != nil {
			errs = append(errs, fmt.Errorf("disconnect %s: %w", name, err))
			continue
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("undo attach of %s: %w", att.VolumeID, err)
	}
	klog.FromContext(ctx).V(2).Info("Undid an attach", "volumeID", att.VolumeID, "nqn", c.nqn, "controllers", strings.Join(c.ctrls, ","))
	return nil
}

// connectOnce connects every endpoint that has no controller yet,
// optimized ones first, and returns the controllers it created. An
// endpoint that fails is logged and skipped: the volume may still be
// usable over the others, and the monitor keeps trying. Only when no
// endpoint has a controller is it an error.
func (a *Attacher) connectOnce(ctx context.Context, n *volume.NVMeTCP, s volume.Secrets) ([]string, error) {
	h, err := a.reader.ReadTarget(n.NQN)
	if err != nil {
		return nil, fmt.Errorf("read nvme state: %w", err)
	}
	opt, others := nvme.OrderedEndpoints(n)
	present := 0
	var created []string
	var errs []error
	for _, ep := range append(opt, others...) {
		if nvme.Covered(h, n.NQN, ep) {
			present++
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, a.cfg.ConnectTimeout)
		r, err := a.cfg.Connector.Connect(cctx, nvme.ConnectOptions(n, ep, a.cfg.Host, s))
		cancel()
		switch {
		case err == nil:
			present++
			created = append(created, r.Name())
			klog.FromContext(ctx).V(2).Info("Connected path", "nqn", n.NQN, "endpoint", ep.String(), "controller", r.Name())
		case errors.Is(err, fabrics.ErrAlreadyConnected):
			present++
		default:
			klog.FromContext(ctx).Error(err, "Connect failed", "nqn", n.NQN, "endpoint", ep.String())
			errs = append(errs, err)
		}
	}
	if present == 0 {
		return created, fmt.Errorf("%w: %w", ErrNoPath, errors.Join(errs...))
	}
	return created, nil
}

// waitDevice polls sysfs until the volume's namespace has a device node
// and a usable path, or AttachWait passes.
func (a *Attacher) waitDevice(ctx context.Context, exp nvme.Expectation) (volume.Device, error) {
	start := a.cfg.Clock.Now()
	for {
		dev, err := a.device(exp)
		if err == nil {
			return dev, nil
		}
		if a.cfg.Clock.Since(start) >= a.cfg.AttachWait {
			return volume.Device{}, err
		}
		select {
		case <-ctx.Done():
			return volume.Device{}, ctx.Err()
		case <-a.cfg.Clock.After(a.cfg.Poll):
		}
	}
}

// device locates the namespace and verifies its block device.
func (a *Attacher) device(exp nvme.Expectation) (volume.Device, error) {
	h, err := a.reader.ReadTarget(exp.NQN)
	if err != nil {
		return volume.Device{}, err
	}
	loc, err := nvme.Locate(h, exp)
	if err != nil {
		return volume.Device{}, err
	}
	if loc.Device == "" || nvme.UsablePaths(h, loc.Namespace) == 0 {
		return volume.Device{}, fmt.Errorf("%w: %s has no usable path yet", nvme.ErrNamespaceNotFound, nvme.NamespaceLabel(loc.Namespace))
	}
	if loc.Namespace.Sectors == 0 {
		return volume.Device{}, fmt.Errorf("namespace %s reports size 0", loc.Device)
	}
	// The device number identifies this device: a later head of the same
	// name is another device. Optional: older captures lack it.
	num, err := nvme.OptionalDeviceNumberOf(a.cfg.SysFS, loc.Device)
	if err != nil {
		return volume.Device{}, err
	}
	return volume.Device{
		Path:      filepath.Join(a.cfg.DevRoot, string(loc.Device)),
		SizeBytes: int64(loc.Namespace.Sectors) * 512,
		Number:    num,
	}, nil
}

// defectsOf diagnoses the volume's subsystem: the defects that name the
// volume or tear down a controller of its NQN. StaleEndpoint is left to the
// monitor: endpoints other volumes no longer list are not this stage's
// business.
func (a *Attacher) defectsOf(exp nvme.Expectation) ([]heal.Defect, error) {
	h, err := a.reader.ReadTarget(exp.NQN)
	if err != nil {
		return nil, err
	}
	var mine []heal.Defect
	for _, d := range nvme.Inspect(h, []nvme.Expectation{exp}) {
		if d.Kind != heal.StaleEndpoint && nvme.Concerns(h, d, exp) {
			mine = append(mine, d)
		}
	}
	return mine, nil
}

// Detach disconnects the volume's controllers (those to its endpoints,
// and those of its subsystem whose address is unknown) unless a
// co-tenant record names the same subsystem: its controllers are that
// volume's paths too (or will be, for an attaching one). It tears nothing down while co.Err
// is set. Detaching a volume with no controllers is not an error.
func (a *Attacher) Detach(ctx context.Context, rec volume.Record, co volume.CoTenants) error {
	n := rec.Context.NVMe
	if n == nil {
		return errors.New("nvme attacher: record is not nvme-tcp")
	}
	if err := co.Err(); err != nil {
		return fmt.Errorf("detach %s: %w", rec.VolumeID, err)
	}
	if users := co.IDs(); len(users) > 0 {
		klog.FromContext(ctx).Info("Leaving shared controllers connected", "volumeID", rec.VolumeID, "nqn", n.NQN, "reason", "other volumes use the subsystem", "volumes", strings.Join(users, ","))
		return nil
	}
	h, err := a.reader.ReadTarget(n.NQN)
	if err != nil {
		return err
	}
	for _, ep := range n.Endpoints {
		for _, c := range nvme.ControllersTo(h, n.NQN, ep) {
			if err := a.cfg.Connector.Disconnect(string(c.Name)); err != nil {
				return err
			}
			klog.FromContext(ctx).V(2).Info("Disconnected path", "volumeID", rec.VolumeID, "controller", c.Name, "endpoint", ep.String())
		}
	}
	// A controller of the subsystem whose address is unknown (not live
	// since this process first saw it) goes to some endpoint of a
	// subsystem no staged volume of the node uses any more: whichever it
	// is, no volume needs it, and left behind it would reconnect for as
	// long as its ctrl_loss_tmo allows (for ever with pathmend's -1).
	for _, c := range nvme.Unplaced(h, n.NQN) {
		if err := a.cfg.Connector.Disconnect(string(c.Name)); err != nil {
			return err
		}
		klog.FromContext(ctx).V(2).Info("Disconnected path", "volumeID", rec.VolumeID, "controller", c.Name, "state", c.State, "endpoint", nvme.AddressNotKnown)
	}
	return nil
}

// Expand rescans the volume's controllers and returns the namespace size,
// waiting briefly for the kernel to publish a changed size.
func (a *Attacher) Expand(ctx context.Context, rec volume.Record) (int64, error) {
	n := rec.Context.NVMe
	if n == nil {
		return 0, errors.New("nvme attacher: record is not nvme-tcp")
	}
	exp := nvme.ExpectationOf(rec.VolumeID, n)
	before, err := a.device(exp)
	if err != nil {
		return 0, err
	}
	h, err := a.reader.ReadTarget(n.NQN)
	if err != nil {
		return 0, err
	}
	for _, ep := range n.Endpoints {
		for _, c := range nvme.ControllersTo(h, n.NQN, ep) {
			if c.State == nvme.StateLive {
				if err := a.cfg.Connector.Rescan(string(c.Name)); err != nil {
					klog.FromContext(ctx).Error(err, "Rescan failed", "controller", c.Name)
				}
			}
		}
	}
	start := a.cfg.Clock.Now()
	for a.cfg.Clock.Since(start) < 2*time.Second {
		if dev, err := a.device(exp); err == nil && dev.SizeBytes != before.SizeBytes {
			return dev.SizeBytes, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-a.cfg.Clock.After(a.cfg.Poll):
		}
	}
	return before.SizeBytes, nil
}

// Health grades the volume's paths from a fresh read of its own
// subsystem's objects (nvme.Reader.ReadTarget): a handful of files,
// whatever the number of volumes on the node.
func (a *Attacher) Health(_ context.Context, rec volume.Record) volume.Condition {
	n := rec.Context.NVMe
	if n == nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: "NotNVMe", Message: "record is not nvme-tcp"}
	}
	h, err := a.reader.ReadTarget(n.NQN)
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: "SysfsUnreadable", Message: err.Error()}
	}
	exp := nvme.ExpectationOf(rec.VolumeID, n)
	c := nvme.ConditionOf(nvme.ReportPaths(h, exp))
	c.Devices = nvme.CurrentDevices(a.cfg.SysFS, h, exp)
	return c
}

func summarize(outs []heal.Outcome) string {
	if len(outs) == 0 {
		return "no repair applied"
	}
	parts := make([]string, 0, len(outs))
	for _, o := range outs {
		parts = append(parts, fmt.Sprintf("%s %s: %s", o.Defect.Kind, o.Verdict, o.Reason))
	}
	return strings.Join(parts, "; ")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
