package iscsi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/scrub"

	"github.com/pathmend/pathmend/pkg/volume"
)

// DefaultIface is open-iscsi's iface for iscsi_tcp without a binding.
const DefaultIface = "default"

// Node identifies an open-iscsi node record: target, portal and iface.
type Node struct {
	Target string
	Portal volume.Endpoint
	// Iface is the open-iscsi iface; "" means DefaultIface.
	Iface string
}

func (n Node) iface() string {
	if n.Iface == "" {
		return DefaultIface
	}
	return n.Iface
}

// String renders "iqn… 127.0.0.1:3260".
func (n Node) String() string { return n.Target + " " + n.Portal.String() }

// key identifies the record for locking and cooldowns.
func (n Node) key() string { return n.Target + "," + n.Portal.String() + "," + n.iface() }

// HealKey names the node record in the heal: the key of its SessionDown
// defect in `pathmend diagnose` and of its login and relogin cooldown in
// the shared heal.Policy ("<target> <portal> <iface>").
func (n Node) HealKey() string { return n.Target + " " + n.Portal.String() + " " + n.iface() }

// args selects the record on an iscsiadm -m node command line.
func (n Node) args() []string {
	return []string{"-m", "node", "-T", n.Target, "-p", n.Portal.String(), "-I", n.iface()}
}

// Setting is one node record setting for UpdateNode. A Secret value is
// never shown in a log line or an error.
type Setting struct {
	Name   string
	Value  string
	Secret bool
}

// NodeExists reports whether the node record exists
// (iscsiadm -m node -T … -p … -I …; 21 means it does not). The output,
// which lists the record's settings, is discarded.
func (in *Initiator) NodeExists(ctx context.Context, n Node) (bool, error) {
	var exists bool
	err := in.shared(ctx, n, func() error {
		_, err := in.run(ctx, in.cfg.CommandTimeout, in.iscsiadm(n.args()...))
		switch {
		case err == nil:
			exists = true
			return nil
		case errors.Is(err, ErrNoObjects):
			return nil
		}
		return err
	})
	return exists, err
}

// CreateNode creates a static node record (-o new). iscsiadm replaces an
// existing record with one of default settings, and refuses (15) when a
// session uses it, so callers create only a record NodeExists denies.
func (in *Initiator) CreateNode(ctx context.Context, n Node) error {
	return in.shared(ctx, n, func() error {
		_, err := in.run(ctx, in.cfg.CommandTimeout, in.iscsiadm(append(n.args(), "-o", "new")...))
		if err != nil {
			return fmt.Errorf("create node record %s: %w", n, err)
		}
		klog.FromContext(ctx).V(2).Info("Created iSCSI node record", "target", n.Target, "portal", n.Portal.String(), "iface", n.iface())
		return nil
	})
}

// Discover runs sendtargets discovery against portal (-o new: records the
// target does not report are kept, existing records are left as they are).
// Discovery authentication is not supported.
func (in *Initiator) Discover(ctx context.Context, portal volume.Endpoint, iface string) error {
	n := Node{Target: "discovery", Portal: portal, Iface: iface}
	return in.shared(ctx, n, func() error {
		args := []string{"-m", "discovery", "-t", "sendtargets", "-p", portal.String(), "-I", n.iface(), "-o", "new"}
		if _, err := in.run(ctx, in.cfg.LoginTimeout, in.iscsiadm(args...)); err != nil {
			return fmt.Errorf("sendtargets discovery at %s: %w", portal, err)
		}
		return nil
	})
}

// UpdateNode applies settings to the node record, one -o update each.
// iscsiadm takes values only in argv (it cannot read them from stdin or a
// file), so a secret value is on the command line of the iscsiadm process
// for the milliseconds it runs; it is never logged (see docs/iscsi.md).
func (in *Initiator) UpdateNode(ctx context.Context, n Node, settings []Setting) error {
	return in.shared(ctx, n, func() error {
		for _, s := range settings {
			c := in.iscsiadm(append(n.args(), "-o", "update", "-n", s.Name, "-v", s.Value)...)
			if s.Secret {
				c.secrets = []string{s.Value}
				scrub.Add(settingKind(s.Name), s.Value)
			}
			if _, err := in.run(ctx, in.cfg.CommandTimeout, c); err != nil {
				return fmt.Errorf("set %s on node record %s: %w", s.Name, n, err)
			}
		}
		return nil
	})
}

// settingKind is what the value of a node record setting is.
func settingKind(name string) scrub.Kind {
	switch {
	case strings.HasSuffix(name, ".password"):
		return scrub.CHAPPassword
	case strings.HasSuffix(name, ".password_in"):
		return scrub.MutualCHAPPassword
	case strings.HasSuffix(name, ".username"):
		return scrub.CHAPUser
	case strings.HasSuffix(name, ".username_in"):
		return scrub.MutualCHAPUser
	}
	return scrub.RequestSecret
}

// DeleteNode deletes the node record (and the CHAP secrets stored in it).
// A record that does not exist is not an error.
func (in *Initiator) DeleteNode(ctx context.Context, n Node) error {
	return in.shared(ctx, n, func() error {
		_, err := in.run(ctx, in.cfg.CommandTimeout, in.iscsiadm(append(n.args(), "-o", "delete")...))
		if err != nil && !errors.Is(err, ErrNoObjects) {
			return fmt.Errorf("delete node record %s: %w", n, err)
		}
		return nil
	})
}

// Login logs in to the node record and returns once iscsid reports the
// session logged in, or at the login timeout. A session that is already
// present (15) is not an error: the caller finds it in sysfs either way.
func (in *Initiator) Login(ctx context.Context, n Node) error {
	return in.shared(ctx, n, func() error {
		_, err := in.run(ctx, in.cfg.LoginTimeout, in.iscsiadm(append(n.args(), "--login")...))
		if err != nil && !errors.Is(err, ErrSessionExists) {
			return fmt.Errorf("login %s: %w", n, err)
		}
		klog.FromContext(ctx).V(2).Info("Logged in to iSCSI portal", "target", n.Target, "portal", n.Portal.String())
		return nil
	})
}

// LoginAll logs in to every node at once, at most LoginConcurrency at a
// time, each bounded by the login timeout. errs[i] is the result for
// nodes[i]. With LoginConcurrency 1 the logins run in order on the
// caller's goroutine, so a deterministic scheduler sees no fan-out.
func (in *Initiator) LoginAll(ctx context.Context, nodes []Node) (errs []error) {
	errs = make([]error, len(nodes))
	if in.cfg.LoginConcurrency == 1 {
		for i, n := range nodes {
			if err := ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("login %s: %w", n, err)
				continue
			}
			errs[i] = in.Login(ctx, n)
		}
		return errs
	}
	sem := make(chan struct{}, in.cfg.LoginConcurrency)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = fmt.Errorf("login %s: %w", n, ctx.Err())
				return
			}
			defer func() { <-sem }()
			errs[i] = in.Login(ctx, n)
		}()
	}
	wg.Wait()
	return errs
}

// Logout logs out session sid of node record n (-m session -r SID -u).
// iscsiadm deletes the session's SCSI devices first. A session that no
// longer exists is not an error; a refusal because iscsid is still
// reconnecting it wraps ErrNotConnected.
func (in *Initiator) Logout(ctx context.Context, n Node, sid SessionID) error {
	return in.shared(ctx, n, func() error {
		_, err := in.run(ctx, in.cfg.CommandTimeout, in.iscsiadm("-m", "session", "-r", strconv.Itoa(int(sid)), "-u"))
		if err != nil && !errors.Is(err, ErrNoObjects) {
			return fmt.Errorf("logout %s (%s): %w", sid, n, err)
		}
		klog.FromContext(ctx).V(2).Info("Logged out iSCSI session", "session", sid.String(), "target", n.Target, "portal", n.Portal.String())
		return nil
	})
}

// Rescan asks the kernel to scan exactly one LUN: it writes
// "channel target lun" to class/scsi_host/host<H>/scan. No process runs.
func (in *Initiator) Rescan(addr SCSIAddress) error {
	rel := "class/scsi_host/" + addr.Host.String() + "/scan"
	if err := in.cfg.Writer.WriteAttr(rel, addr.ScanArgs()); err != nil {
		return fmt.Errorf("scan %s: %w", addr, err)
	}
	return nil
}

// FlushMap removes a dm-multipath map (multipath -f NAME). The kernel
// offers no sysfs interface to remove a map, so this runs a command. It
// fails while the map is open (mounted, held by a holder).
func (in *Initiator) FlushMap(ctx context.Context, name string) error {
	_, err := in.run(ctx, in.cfg.CommandTimeout, command{name: in.cfg.Multipath, args: []string{"-f", name}})
	if err != nil {
		return fmt.Errorf("flush multipath map %s: %w", name, err)
	}
	return nil
}

// ResizeMap makes multipathd re-read the size of a map's paths
// (multipathd resize map NAME), after the paths were rescanned.
func (in *Initiator) ResizeMap(ctx context.Context, name string) error {
	_, err := in.run(ctx, in.cfg.CommandTimeout, command{name: in.cfg.Multipathd, args: []string{"resize", "map", name}})
	if err != nil {
		return fmt.Errorf("resize multipath map %s: %w", name, err)
	}
	return nil
}
