package attach

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Detach releases a volume: it flushes the multipath map over the LUN,
// deletes the LUN's disks (device/delete) and logs out each session of
// the volume's portals that no co-tenant of the same target uses — the
// co-tenant gate — deleting its node record with it. A LUN a co-tenant
// also names is left in place. It tears nothing down while co.Err is
// set. Detaching a volume that is not attached is not an error.
func (a *Attacher) Detach(ctx context.Context, rec volume.Record, co volume.CoTenants) error {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return err
	}
	if err := co.Err(); err != nil {
		return fmt.Errorf("detach %s: %w", rec.VolumeID, err)
	}
	others := iscsiCoTenants(co)
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return err
	}
	log := klog.FromContext(ctx).WithValues("volumeID", rec.VolumeID, "iqn", v.IQN)
	// Two records naming one LUN is a misconfiguration, but deleting the
	// disks under the other one would be worse.
	if !sameLUNStaged(others, v) {
		if err := a.removeLUN(ctx, snap, v); err != nil {
			return err
		}
	} else {
		log.V(2).Info("LUN is staged by another volume too; keeping its disks", "lun", v.LUN)
	}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	var errs []error
	for _, ep := range v.Portals {
		node, err := a.node(ctx, v.IQN, ep)
		if err != nil {
			// Without an address the portal's sessions cannot be told
			// from a co-tenant's: leave them.
			log.Info("Keeping iSCSI session: portal does not resolve", "portal", ep.String(), "err", err)
			continue
		}
		if users := portalUsers(m, others, v.IQN, node.Portal); len(users) > 0 {
			log.V(2).Info("Keeping iSCSI session: other volumes use the portal", "portal", ep.String(), "coTenants", users)
			continue
		}
		errs = append(errs, a.logoutPortal(ctx, snap, m, node))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.V(2).Info("Detached iSCSI volume")
	return nil
}

// removeLUN flushes the map over the LUN's disks and deletes the disks.
// A flush that fails stops the detach: deleting paths under an open map
// would fail the I/O of whoever holds it.
func (a *Attacher) removeLUN(ctx context.Context, snap *iscsi.Snapshot, v *volume.ISCSI) error {
	disks := disksOf(snap, v)
	flushed := map[string]bool{}
	for _, d := range disks {
		m, ok := snap.MapOf(d)
		if !ok || flushed[m.Device] {
			continue
		}
		if err := a.flushMap(ctx, m.Name); err != nil {
			return err
		}
		flushed[m.Device] = true
	}
	for _, d := range disks {
		err := a.cfg.Writer.WriteAttr("block/"+d+"/device/delete", "1")
		if err != nil && !sysfs.IsNotExist(err) {
			return fmt.Errorf("delete disk %s: %w", d, err)
		}
	}
	return nil
}

// flushAttempts bounds the tries of one map flush.
const flushAttempts = 5

// flushMap removes a map, trying again a few times, PollInterval apart:
// a map whose file system was unmounted a moment ago may still be open
// for the udev probe of the unmount's change event, and multipath -f
// refuses an open map ("map in use"; multipath-tools' remove_retries
// exists for the same reason). A map that stays open is an error.
func (a *Attacher) flushMap(ctx context.Context, name string) error {
	var err error
	for try := 1; try <= flushAttempts; try++ {
		if err = a.cfg.Initiator.FlushMap(ctx, name); err == nil {
			return nil
		}
		if try == flushAttempts {
			break
		}
		klog.FromContext(ctx).V(2).Info("Multipath map not flushed; trying again", "map", name, "attempt", try, "err", err)
		if serr := sleep(ctx, a.cfg.Clock, a.cfg.PollInterval); serr != nil {
			return err
		}
	}
	return err
}

// node returns the node record of portal ep of target iqn, its host name
// resolved as Attach resolved it.
func (a *Attacher) node(ctx context.Context, iqn string, ep volume.Endpoint) (iscsi.Node, error) {
	r, err := iscsi.ResolveEndpoint(ctx, a.cfg.Resolver, ep)
	if err != nil {
		return iscsi.Node{}, err
	}
	return iscsi.Node{Target: iqn, Portal: r, Iface: a.cfg.Iface}, nil
}

// logoutPortal logs out every session of node and deletes the node
// record, so the CHAP secrets stored in it do not outlive the volume.
func (a *Attacher) logoutPortal(ctx context.Context, snap *iscsi.Snapshot, m *iscsi.PortalMatcher, node iscsi.Node) error {
	for _, s := range snap.SessionsOf(node.Target) {
		if !m.Session(s, node.Target, node.Portal) {
			continue
		}
		if err := a.cfg.Initiator.Logout(ctx, node, s.ID); err != nil {
			return err
		}
	}
	return a.cfg.Initiator.DeleteNode(ctx, node)
}

// disksOf lists the disks of the volume's LUN on every session to its
// target.
func disksOf(snap *iscsi.Snapshot, v *volume.ISCSI) []string {
	var disks []string
	for _, s := range snap.SessionsOf(v.IQN) {
		if l, ok := s.LUN(v.LUN); ok && l.Disk != "" {
			disks = append(disks, l.Disk)
		}
	}
	return disks
}

// iscsiCoTenants keeps the iSCSI co-tenant records.
func iscsiCoTenants(co volume.CoTenants) []volume.Record {
	var out []volume.Record
	for _, r := range co.Records {
		if r.Context.Transport == volume.TransportISCSI && r.Context.ISCSI != nil {
			out = append(out, r)
		}
	}
	return out
}

// portalUsers returns the co-tenants of target iqn that list the portal
// at addr (an IP endpoint), comparing their endpoints by address.
func portalUsers(m *iscsi.PortalMatcher, others []volume.Record, iqn string, addr volume.Endpoint) []string {
	var ids []string
	for _, o := range others {
		if o.Context.ISCSI.IQN != iqn {
			continue
		}
		for _, p := range o.Context.ISCSI.Portals {
			if m.Match(p, addr.Host, int(addr.Port)) {
				ids = append(ids, o.VolumeID)
				break
			}
		}
	}
	return ids
}

// sameLUNStaged reports whether another volume names the same target LUN.
func sameLUNStaged(others []volume.Record, v *volume.ISCSI) bool {
	for _, o := range others {
		if o.Context.ISCSI.IQN == v.IQN && o.Context.ISCSI.LUN == v.LUN {
			return true
		}
	}
	return false
}

// Undo removes what one Attach created (att.Created) and nothing that
// existed before it: on each portal that had no session before the call
// and that no co-tenant uses, the LUN's map is flushed (unless a
// co-tenant names the LUN) and the portal's sessions are logged out; the
// node records the call created and no co-tenant uses are deleted (with
// the CHAP secrets in them). It runs on a context detached from the
// caller's cancellation; every command keeps its own timeout. It returns
// an error when something it should remove stays: co.Err forbids any
// teardown, or a command failed.
func (a *Attacher) Undo(ctx context.Context, att volume.Attachment, co volume.CoTenants) error {
	c, _ := att.Created.(*created)
	if c == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	if err := co.Err(); err != nil {
		return fmt.Errorf("keep %s of %s: %w", c, c.iqn, err)
	}
	log := klog.FromContext(ctx).WithValues("volumeID", att.VolumeID, "iqn", c.iqn)
	others := iscsiCoTenants(co)
	now, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return fmt.Errorf("undo attach of %s: %w", att.VolumeID, err)
	}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	v := &volume.ISCSI{IQN: c.iqn, LUN: c.lun}
	var errs []error
	var logout []iscsi.Node
	for _, n := range c.fresh {
		if len(portalUsers(m, others, c.iqn, n.Portal)) == 0 {
			logout = append(logout, n)
		}
	}
	// The map over disks on sessions about to go is flushed first:
	// removing the paths under it would leave a map with none.
	if len(logout) > 0 && !sameLUNStaged(others, v) {
		if err := a.flushMapsOn(ctx, now, m, v, logout); err != nil {
			return fmt.Errorf("undo attach of %s: %w", att.VolumeID, err)
		}
	}
	for _, n := range logout {
		for _, s := range now.SessionsOf(c.iqn) {
			if m.Session(s, c.iqn, n.Portal) {
				if err := a.cfg.Initiator.Logout(ctx, n, s.ID); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, n := range c.nodes {
		if len(portalUsers(m, others, c.iqn, n.Portal)) > 0 {
			continue
		}
		if err := a.cfg.Initiator.DeleteNode(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("undo attach of %s: %w", att.VolumeID, err)
	}
	log.V(2).Info("Undid an attach", "created", c.String())
	return nil
}

// flushMapsOn flushes the map over the LUN's disks on the sessions of
// nodes (once per map).
func (a *Attacher) flushMapsOn(ctx context.Context, snap *iscsi.Snapshot, m *iscsi.PortalMatcher, v *volume.ISCSI, nodes []iscsi.Node) error {
	flushed := map[string]bool{}
	for _, n := range nodes {
		for _, s := range snap.SessionsOf(v.IQN) {
			if !m.Session(s, v.IQN, n.Portal) {
				continue
			}
			l, ok := s.LUN(v.LUN)
			if !ok || l.Disk == "" {
				continue
			}
			mp, ok := snap.MapOf(l.Disk)
			if !ok || flushed[mp.Device] {
				continue
			}
			if err := a.flushMap(ctx, mp.Name); err != nil {
				return err
			}
			flushed[mp.Device] = true
		}
	}
	return nil
}

func hasSession(m *iscsi.PortalMatcher, snap *iscsi.Snapshot, iqn string, ep volume.Endpoint) bool {
	for _, s := range snap.SessionsOf(iqn) {
		if m.Session(s, iqn, ep) {
			return true
		}
	}
	return false
}

// Expand rescans every disk of the volume's LUN (device/rescan), makes
// multipathd re-read the map's size, and returns the size the device has
// now.
func (a *Attacher) Expand(ctx context.Context, rec volume.Record) (int64, error) {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return 0, err
	}
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return 0, err
	}
	disks := disksOf(snap, v)
	if len(disks) == 0 {
		return 0, fmt.Errorf("expand %s LUN %d: %w", v.IQN, v.LUN, errNoDevice)
	}
	// Rescan only live disks: the rescan of a blocked device waits for the
	// session to recover.
	for _, d := range disks {
		if !snap.Live(d) {
			continue // a blocked device would hold the rescan until it recovers
		}
		if err := a.cfg.Writer.WriteAttr("block/"+d+"/device/rescan", "1"); err != nil {
			return 0, fmt.Errorf("rescan %s: %w", d, err)
		}
	}
	if m, ok := snap.MapOf(disks[0]); ok {
		if err := a.cfg.Initiator.ResizeMap(ctx, m.Name); err != nil {
			return 0, err
		}
		return sizeBytes(a, m.Device)
	}
	return sizeBytes(a, disks[0])
}

// sizeBytes reads the size of a block device in bytes.
func sizeBytes(a *Attacher, dev string) (int64, error) {
	n, err := a.cfg.Sys.ReadIntAttr("block/" + dev + "/size")
	return n * sectorSize, err
}

// sectorSize is the unit of a block device's size attribute.
const sectorSize = 512
