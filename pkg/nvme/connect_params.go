package nvme

import (
	"fmt"
	"strconv"

	"github.com/pathmend/pathmend/pkg/scrub"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// ConnectParams are the connect options of one fabrics controller that
// the kernel publishes in sysfs beyond the Controller model (which holds
// the address, host NQN, timeouts and keep-alive): what a reconnect needs
// to make the same controller again. Companion mode learns them for the
// controllers another driver connected.
//
// What the kernel does not publish cannot be learned: the discovery
// options, tos, the data and header digests, nr_write_queues and
// nr_poll_queues, and on kernels built without NVMe in-band
// authentication (Debian's 6.1) the DH-HMAC-CHAP keys.
type ConnectParams struct {
	// HostID is class/nvme/<ctrl>/hostid, the host identifier the
	// controller was connected with.
	HostID string `json:"hostid"`
	// QueueCount is class/nvme/<ctrl>/queue_count: the I/O queues the
	// connect negotiated plus the admin queue.
	QueueCount int `json:"queueCount,omitempty"`
	// SQSize is class/nvme/<ctrl>/sqsize: the I/O queue size the
	// connect negotiated, minus one (the kernel's 0's based value).
	SQSize int `json:"sqsize,omitempty"`
	// DHCHAP is set when class/nvme/<ctrl>/dhchap_secret exists and
	// holds a key ("none" when it holds none). The key itself is not
	// returned.
	DHCHAP bool `json:"dhchap,omitempty"`
}

// ReadConnectParams reads the connect parameters of fabrics controller
// name. hostid is required (every fabrics controller publishes it);
// queue_count and sqsize read as zero when absent; dhchap_secret is only
// tested for a key, never returned.
func ReadConnectParams(fsys sysfs.FS, name ControllerName) (ConnectParams, error) {
	dir := classNVMe + "/" + string(name) + "/"
	var p ConnectParams
	var err error
	if p.HostID, err = fsys.ReadAttr(dir + "hostid"); err != nil {
		return ConnectParams{}, err
	}
	for _, a := range []struct {
		name string
		dst  *int
	}{{"queue_count", &p.QueueCount}, {"sqsize", &p.SQSize}} {
		v, ok, err := fsys.ReadOptionalAttr(dir + a.name)
		if err != nil {
			return ConnectParams{}, err
		}
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return ConnectParams{}, fmt.Errorf("parse %s%s: %q: %w", dir, a.name, v, errSyntax)
		}
		*a.dst = int(n)
	}
	v, ok, err := fsys.ReadOptionalAttr(dir + "dhchap_secret")
	if err != nil {
		return ConnectParams{}, err
	}
	p.DHCHAP = ok && v != "" && v != "none"
	return p, nil
}

// SiblingSecrets reads the DH-HMAC-CHAP secrets a controller of subsystem
// nqn holds (class/nvme/<ctrl>/dhchap_secret and dhchap_ctrl_secret, on
// kernels built with in-band authentication), for a reconnect of another
// path of it: pathmend never stores a secret, and the kernel keeps the
// ones the first connect gave it. Empty when no controller has any. The
// values must never be logged: each is handed to the process's scrubber
// as it is read.
func SiblingSecrets(fsys sysfs.FS, host *Host, nqn string) volume.Secrets {
	var s volume.Secrets
	for _, c := range host.Controllers {
		if c.SubsysNQN != nqn {
			continue
		}
		dir := classNVMe + "/" + string(c.Name) + "/"
		if v, ok, _ := fsys.ReadOptionalAttr(dir + "dhchap_secret"); ok && v != "none" {
			s.DHCHAPSecret = v
			scrub.Add(scrub.DHCHAPKey, v)
		}
		if v, ok, _ := fsys.ReadOptionalAttr(dir + "dhchap_ctrl_secret"); ok && v != "none" {
			s.DHCHAPCtrlSecret = v
			scrub.Add(scrub.DHCHAPKey, v)
		}
		if s.DHCHAPSecret != "" {
			return s
		}
	}
	return s
}
