package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Defaults of AttacherConfig.
const (
	DefaultNodeLoginTimeout = 15 * time.Second
	DefaultNodeLoginRetries = 3
	DefaultDeviceTimeout    = 30 * time.Second
	DefaultMultipathWait    = 10 * time.Second
	DefaultPollInterval     = 200 * time.Millisecond
	// scanAfter is how long a logged-in session may lack the LUN before
	// the attacher scans exactly that LUN (the target may have added it
	// after the login's own scan).
	scanAfter = 2 * time.Second
)

// DiscoveryMode says how node records are created.
type DiscoveryMode string

const (
	// DiscoveryStatic creates one node record per portal (-o new).
	DiscoveryStatic DiscoveryMode = "static"
	// DiscoverySendTargets runs sendtargets discovery at the portals and
	// uses the records the target reports.
	DiscoverySendTargets DiscoveryMode = "sendtargets"
)

// AttrWriter writes a sysfs attribute; sysfs.FS implements it. The
// attacher's writes (a LUN disk's device/delete and device/rescan) go
// through it, so a fake kernel can act on them.
type AttrWriter interface {
	WriteAttr(rel, value string) error
}

// SessionClocks tells how long the observer has seen a session out of
// LOGGED_IN. *SessionHealer implements it; Health uses it for its message.
type SessionClocks interface {
	DownFor(id iscsi.SessionID) (time.Duration, bool)
}

// AttacherConfig configures an Attacher.
type AttacherConfig struct {
	// Sys is the sysfs root. Required.
	Sys sysfs.FS
	// DevRoot is where device nodes live, "/dev". Required.
	DevRoot string
	// Initiator runs iscsiadm and multipath. Required.
	Initiator *iscsi.Initiator
	// Writer writes sysfs attributes; Sys when nil.
	Writer AttrWriter
	// Iface is the open-iscsi iface; iscsi.DefaultIface when empty.
	Iface string
	// Discovery is static (default) or sendtargets.
	Discovery DiscoveryMode
	// NodeLoginTimeout is node.conn[0].timeo.login_timeout and
	// NodeLoginRetries node.session.initial_login_retry_max: iscsid gives
	// an initial login up after about their product, which must fit the
	// initiator's login command timeout.
	NodeLoginTimeout time.Duration
	NodeLoginRetries int
	// DeviceTimeout bounds the wait for the LUN's disks after login.
	DeviceTimeout time.Duration
	// MultipathWait bounds the wait for multipathd to assemble a map over
	// the LUN's disks, even over a single one: multipathd with
	// find_multipaths "no" maps single paths too, a moment after the disk
	// appears, and a disk handed out before that would be claimed under
	// its user (measured in the lab: mount fails "already mounted or
	// busy"). Without a map by then the attacher uses one disk.
	MultipathWait time.Duration
	// NoMultipathd says the node runs no multipathd: Attach does not wait
	// for a map that cannot come, and uses one disk.
	NoMultipathd bool
	// PollInterval is how often sysfs is re-read while waiting.
	PollInterval time.Duration
	// Resolver resolves portal host names; net.DefaultResolver when nil.
	Resolver iscsi.Resolver
	// Clocks, when set, lets Health say how long a session has been down.
	Clocks SessionClocks
	// Clock times the waits for disks and maps; the real clock when nil.
	Clock clock.Clock
	// VerifyNode checks that the device node at path is the block device
	// whose sysfs dev attribute is devt ("8:0"); a stat of the node when
	// nil. A fake host whose /dev holds plain files injects its own.
	VerifyNode func(path, devt string) error
}

// Attacher attaches iSCSI volumes: it logs in to every portal of the
// volume, finds the LUN's disks and the dm-multipath map over them, and
// verifies them before handing the device out. It implements
// the driver's Attacher (pkg/driver), through pkg/volume types only. It keeps no state: co-tenants come with each call from
// the node's intent owner, whose target lease serializes Attach, Undo and
// Detach of one target (the callers hold it).
type Attacher struct {
	cfg AttacherConfig
	// checkNode verifies a device node against the sysfs dev attribute;
	// tests that cannot create device nodes replace it.
	checkNode func(path, devt string) error
}

// NewAttacher validates cfg and returns an Attacher. Nothing is read or run.
func NewAttacher(cfg AttacherConfig) (*Attacher, error) {
	switch {
	case cfg.Sys.Root() == "" || cfg.Sys.Root() == ".":
		return nil, errors.New("iscsi attacher: no sysfs root")
	case cfg.DevRoot == "":
		return nil, errors.New("iscsi attacher: no device root")
	case cfg.Initiator == nil:
		return nil, errors.New("iscsi attacher: no initiator")
	}
	switch cfg.Discovery {
	case "":
		cfg.Discovery = DiscoveryStatic
	case DiscoveryStatic, DiscoverySendTargets:
	default:
		return nil, fmt.Errorf("iscsi attacher: unknown discovery mode %q", cfg.Discovery)
	}
	if cfg.NodeLoginTimeout < 0 || cfg.NodeLoginRetries < 0 || cfg.DeviceTimeout < 0 || cfg.MultipathWait < 0 || cfg.PollInterval < 0 {
		return nil, errors.New("iscsi attacher: timeouts and retries must not be negative")
	}
	if cfg.Iface == "" {
		cfg.Iface = iscsi.DefaultIface
	}
	setDuration(&cfg.NodeLoginTimeout, DefaultNodeLoginTimeout)
	setDuration(&cfg.DeviceTimeout, DefaultDeviceTimeout)
	setDuration(&cfg.MultipathWait, DefaultMultipathWait)
	setDuration(&cfg.PollInterval, DefaultPollInterval)
	if cfg.NodeLoginRetries == 0 {
		cfg.NodeLoginRetries = DefaultNodeLoginRetries
	}
	if cfg.NodeLoginTimeout%time.Second != 0 {
		return nil, fmt.Errorf("iscsi attacher: node login timeout %s is not whole seconds", cfg.NodeLoginTimeout)
	}
	// A login command killed at its deadline while iscsid still retries
	// would leave a session appearing after Attach gave up.
	if budget := cfg.NodeLoginTimeout * time.Duration(cfg.NodeLoginRetries); budget > cfg.Initiator.LoginTimeout() {
		return nil, fmt.Errorf("iscsi attacher: iscsid may retry a login for %s, longer than the login command timeout %s", budget, cfg.Initiator.LoginTimeout())
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Writer == nil {
		cfg.Writer = cfg.Sys
	}
	if cfg.VerifyNode == nil {
		cfg.VerifyNode = checkBlockNode
	}
	return &Attacher{cfg: cfg, checkNode: cfg.VerifyNode}, nil
}

func setDuration(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

// iscsiContext returns the iSCSI part of a volume context.
func iscsiContext(c volume.Context) (*volume.ISCSI, error) {
	if c.Transport != volume.TransportISCSI || c.ISCSI == nil {
		return nil, fmt.Errorf("volume context is for transport %q, not %q", c.Transport, volume.TransportISCSI)
	}
	return c.ISCSI, nil
}

// created is what one Attach call created: node records that did not
// exist, and the portals that had no session before it (a session there
// now is the call's, whether its login returned success or not).
type created struct {
	iqn   string
	lun   int
	nodes []iscsi.Node
	fresh []iscsi.Node
}

func (c *created) String() string {
	var parts []string
	if len(c.nodes) > 0 {
		parts = append(parts, "node records "+portalList(c.nodes))
	}
	if len(c.fresh) > 0 {
		parts = append(parts, "sessions to "+portalList(c.fresh))
	}
	return strings.Join(parts, "; ")
}

func portalList(nodes []iscsi.Node) string {
	s := make([]string, len(nodes))
	for i, n := range nodes {
		s[i] = n.Portal.String()
	}
	return strings.Join(s, ",")
}

// attachment returns att with c as what was created, nil when nothing was.
func (c *created) attachment(att volume.Attachment) volume.Attachment {
	if len(c.nodes) > 0 || len(c.fresh) > 0 {
		att.Created = c
	}
	return att
}

// Attach logs in to every portal of the volume (in parallel), waits for
// the LUN's disks, verifies that they are one LUN (same WWID where one is
// published, same size, the map's size too)
// and returns the multipath map over them, or the single disk when
// multipathd assembles none. At least one portal must log in; portals that
// fail are logged and left to the session heal. Attach is idempotent. The
// attachment names the node records this call created and the portals
// that had no session before it, also when it fails: Undo removes them
// (sparing what co-tenants use).
func (a *Attacher) Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	att := volume.Attachment{VolumeID: req.VolumeID, Context: req.Context}
	v, err := iscsiContext(req.Context)
	if err != nil {
		return att, err
	}
	log := klog.FromContext(ctx).WithValues("volumeID", req.VolumeID, "iqn", v.IQN)

	nodes, err := a.nodes(ctx, v)
	if err != nil {
		return att, err
	}
	before, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return att, err
	}
	c := &created{iqn: v.IQN, lun: v.LUN}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	for _, n := range nodes {
		if !hasSession(m, before, v.IQN, n.Portal) {
			c.fresh = append(c.fresh, n)
		}
	}
	c.nodes, err = a.prepareNodes(ctx, v, nodes, req.Secrets)
	if err != nil {
		return c.attachment(att), err
	}
	errs := a.cfg.Initiator.LoginAll(ctx, nodes)
	var loggedIn []iscsi.Node
	var failed []error
	for i, n := range nodes {
		if errs[i] != nil {
			failed = append(failed, errs[i])
			log.Info("Portal login failed; the session heal retries it", "portal", n.Portal.String(), "err", errs[i])
			continue
		}
		loggedIn = append(loggedIn, n)
	}
	if len(loggedIn) == 0 {
		return c.attachment(att), fmt.Errorf("no portal of %s logged in: %w", v.IQN, errors.Join(failed...))
	}
	dev, err := a.findDevice(ctx, v, loggedIn)
	if err != nil {
		return c.attachment(att), err
	}
	log.V(2).Info("Attached iSCSI volume", "device", dev.Path, "sizeBytes", dev.SizeBytes, "portals", len(loggedIn), "of", len(nodes))
	att = c.attachment(att)
	att.Device = dev
	return att, nil
}

// nodes returns the node record of each portal, host names resolved.
func (a *Attacher) nodes(ctx context.Context, v *volume.ISCSI) ([]iscsi.Node, error) {
	nodes := make([]iscsi.Node, 0, len(v.Portals))
	for _, p := range v.Portals {
		ep, err := iscsi.ResolveEndpoint(ctx, a.cfg.Resolver, p)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, iscsi.Node{Target: v.IQN, Portal: ep, Iface: a.cfg.Iface})
	}
	return nodes, nil
}

// prepareNodes makes sure every node record exists and carries the
// volume's settings. It returns the records this call created.
func (a *Attacher) prepareNodes(ctx context.Context, v *volume.ISCSI, nodes []iscsi.Node, sec volume.Secrets) (created []iscsi.Node, err error) {
	in := a.cfg.Initiator
	if a.cfg.Discovery == DiscoverySendTargets {
		missing, err := a.missingNodes(ctx, nodes)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			if err := a.discover(ctx, nodes); err != nil {
				return nil, err
			}
			// Discovery creates records for every portal the target
			// reports; the volume's portals must be among them.
			for _, n := range missing {
				ok, err := in.NodeExists(ctx, n)
				if err != nil {
					return created, err
				}
				if !ok {
					return created, fmt.Errorf("sendtargets discovery did not report portal %s of %s", n.Portal, v.IQN)
				}
				created = append(created, n)
			}
		}
	} else {
		for _, n := range nodes {
			ok, err := in.NodeExists(ctx, n)
			if err != nil {
				return created, err
			}
			if ok {
				continue
			}
			if err := in.CreateNode(ctx, n); err != nil {
				return created, err
			}
			created = append(created, n)
		}
	}
	settings := a.settings(v, sec)
	for _, n := range nodes {
		if err := in.UpdateNode(ctx, n, settings); err != nil {
			return created, err
		}
	}
	return created, nil
}

func (a *Attacher) missingNodes(ctx context.Context, nodes []iscsi.Node) ([]iscsi.Node, error) {
	var missing []iscsi.Node
	for _, n := range nodes {
		ok, err := a.cfg.Initiator.NodeExists(ctx, n)
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// discover runs sendtargets discovery at each portal in turn until one
// answers.
func (a *Attacher) discover(ctx context.Context, nodes []iscsi.Node) error {
	var errs []error
	for _, n := range nodes {
		err := a.cfg.Initiator.Discover(ctx, n.Portal, n.Iface)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// settings are the node record settings of a volume. CHAP values are
// marked secret so no log line or error shows them.
func (a *Attacher) settings(v *volume.ISCSI, sec volume.Secrets) []iscsi.Setting {
	s := []iscsi.Setting{
		{Name: "node.startup", Value: "manual"},
		{Name: "node.conn[0].timeo.login_timeout", Value: strconv.Itoa(int(a.cfg.NodeLoginTimeout / time.Second))},
		{Name: "node.session.initial_login_retry_max", Value: strconv.Itoa(a.cfg.NodeLoginRetries)},
	}
	if v.ReplacementTimeout != nil {
		s = append(s, iscsi.Setting{Name: "node.session.timeo.replacement_timeout", Value: strconv.Itoa(*v.ReplacementTimeout)})
	}
	if sec.CHAPUsername == "" && sec.CHAPPassword == "" {
		return append(s, iscsi.Setting{Name: "node.session.auth.authmethod", Value: "None"})
	}
	s = append(s,
		iscsi.Setting{Name: "node.session.auth.authmethod", Value: "CHAP"},
		iscsi.Setting{Name: "node.session.auth.username", Value: sec.CHAPUsername, Secret: true},
		iscsi.Setting{Name: "node.session.auth.password", Value: sec.CHAPPassword, Secret: true},
	)
	if sec.CHAPUsernameIn != "" || sec.CHAPPasswordIn != "" {
		s = append(s,
			iscsi.Setting{Name: "node.session.auth.username_in", Value: sec.CHAPUsernameIn, Secret: true},
			iscsi.Setting{Name: "node.session.auth.password_in", Value: sec.CHAPPasswordIn, Secret: true},
		)
	}
	return s
}
