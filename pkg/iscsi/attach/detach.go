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

// Detach releases a staged volume: it flushes the multipath map over the
// LUN, deletes the LUN's disks (device/delete) and logs out each session
// of the volume's portals that no other staged volume of the same target
// uses — the co-tenant gate — deleting its node record with it. A LUN
// another staged volume also names is left in place. Detaching a volume
// that is not attached is not an error.
func (a *Attacher) Detach(ctx context.Context, rec volume.Record) error {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return err
	}
	unlock := a.targets.Lock(v.IQN)
	defer unlock()
	others, err := a.coTenants(rec.VolumeID)
	if err != nil {
		return err
	}
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Now())
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
			log.V(2).Info("Keeping iSCSI session: other staged volumes use the portal", "portal", ep.String(), "coTenants", users)
			continue
		}
		errs = append(errs, a.logoutPortal(ctx, snap, m, node))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.attached, rec.VolumeID)
	a.mu.Unlock()
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
		if err := a.cfg.Initiator.FlushMap(ctx, m.Name); err != nil {
			return err
		}
		flushed[m.Device] = true
	}
	for _, d := range disks {
		err := a.cfg.Sys.WriteAttr("block/"+d+"/device/delete", "1")
		if err != nil && !sysfs.IsNotExist(err) {
			return fmt.Errorf("delete disk %s: %w", d, err)
		}
	}
	return nil
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

// coTenant is another staged (or just attached) iSCSI volume.
type coTenant struct {
	volumeID string
	v        volume.ISCSI
}

// coTenants lists the iSCSI volumes other than volumeID that are staged
// (records) or attached by this process and not yet recorded.
func (a *Attacher) coTenants(volumeID string) ([]coTenant, error) {
	recs, err := a.cfg.Records.List()
	if err != nil {
		return nil, fmt.Errorf("list staged volumes: %w", err)
	}
	// Records cover volumes staged before a restart; the in-memory set
	// covers the window between Attach returning and the driver writing
	// its record.
	seen := map[string]bool{volumeID: true}
	var out []coTenant
	for _, r := range recs {
		if seen[r.VolumeID] || r.Context.Transport != volume.TransportISCSI || r.Context.ISCSI == nil {
			continue
		}
		seen[r.VolumeID] = true
		out = append(out, coTenant{volumeID: r.VolumeID, v: *r.Context.ISCSI})
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, v := range a.attached {
		if !seen[id] {
			seen[id] = true
			out = append(out, coTenant{volumeID: id, v: v})
		}
	}
	return out, nil
}

// portalUsers returns the co-tenants of target iqn that list the portal
// at addr (an IP endpoint), comparing their endpoints by address.
func portalUsers(m *iscsi.PortalMatcher, others []coTenant, iqn string, addr volume.Endpoint) []string {
	var ids []string
	for _, o := range others {
		if o.v.IQN != iqn {
			continue
		}
		for _, p := range o.v.Portals {
			if m.Match(p, addr.Host, int(addr.Port)) {
				ids = append(ids, o.volumeID)
				break
			}
		}
	}
	return ids
}

// sameLUNStaged reports whether another volume names the same target LUN.
func sameLUNStaged(others []coTenant, v *volume.ISCSI) bool {
	for _, o := range others {
		if o.v.IQN == v.IQN && o.v.LUN == v.LUN {
			return true
		}
	}
	return false
}

// rollback undoes what a failed Attach created: sessions to portals that
// had none before (and that no co-tenant uses) are logged out, node
// records it created are deleted. It runs on a context detached from the
// caller's cancellation; every command keeps its own timeout.
func (a *Attacher) rollback(ctx context.Context, volumeID string, v *volume.ISCSI, nodes []iscsi.Node, before *iscsi.Snapshot, created []iscsi.Node) {
	ctx = context.WithoutCancel(ctx)
	log := klog.FromContext(ctx).WithValues("volumeID", volumeID, "iqn", v.IQN)
	others, err := a.coTenants(volumeID)
	if err != nil {
		log.Error(err, "Rollback: cannot tell co-tenants; leaving sessions in place")
		return
	}
	now, err := iscsi.Read(a.cfg.Sys, a.cfg.Now())
	if err != nil {
		log.Error(err, "Rollback: cannot read sessions; leaving them in place")
		return
	}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	isCreated := map[iscsi.Node]bool{}
	for _, n := range created {
		isCreated[n] = true
	}
	for _, n := range nodes {
		if len(portalUsers(m, others, v.IQN, n.Portal)) > 0 || hasSession(m, before, v.IQN, n.Portal) {
			continue
		}
		for _, s := range now.SessionsOf(v.IQN) {
			if m.Session(s, v.IQN, n.Portal) {
				if err := a.cfg.Initiator.Logout(ctx, n, s.ID); err != nil {
					log.Error(err, "Rollback: logout failed", "session", s.ID.String())
				}
			}
		}
		if isCreated[n] {
			if err := a.cfg.Initiator.DeleteNode(ctx, n); err != nil {
				log.Error(err, "Rollback: node record delete failed", "portal", n.Portal.String())
			}
		}
	}
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
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Now())
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
		if err := a.cfg.Sys.WriteAttr("block/"+d+"/device/rescan", "1"); err != nil {
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
