package iscsi

import (
	"slices"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// ReadTarget takes a snapshot, as Read does, of what belongs to target
// iqn only: its sessions with their connections and LUNs, the
// multipath maps over their disks, and the hosts. It equals
// TargetOf(r.Read(at), iqn) at that moment; it is what answering for one
// volume costs (its target's sessions), not a read of the node.
//
// It lists the class directories (to see sessions appear) and reads the
// attributes of iqn's sessions only: a session's target is fixed for its
// life, so the Reader remembers it, and the kernel never gives a session's
// number to another (scsi_transport_iscsi counts them up), so a session
// remembered as another target's is one; a session it has not seen yet,
// or whose login is under way, is read far enough to learn its target. Maps are found through the holders of the
// target's disks. It forgets nothing: only Read prunes.
func (r *Reader) ReadTarget(iqn string, at time.Time) (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pass++
	p := &pass{r: r, sys: r.attrs.FS(), root: r.attrs.OpenRoot()}
	defer p.root.Close()
	return p.target(iqn, at)
}

// TargetOf returns the part of snap that belongs to target iqn: its
// sessions, the multipath maps with a slave among their disks, and the
// hosts.
func TargetOf(snap *Snapshot, iqn string) *Snapshot {
	out := &Snapshot{At: snap.At, Hosts: snap.Hosts}
	disks := map[string]bool{}
	for _, s := range snap.Sessions {
		if s.TargetName != iqn {
			continue
		}
		out.Sessions = append(out.Sessions, s)
		for _, l := range s.LUNs {
			if l.Disk != "" {
				disks[l.Disk] = true
			}
		}
	}
	for _, m := range snap.Maps {
		if slices.ContainsFunc(m.Slaves, func(d string) bool { return disks[d] }) {
			out.Maps = append(out.Maps, m)
		}
	}
	return out
}

// target is one ReadTarget.
func (p *pass) target(iqn string, at time.Time) (*Snapshot, error) {
	snap := &Snapshot{At: at}
	names, err := p.list(sessionClass)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "session") {
			continue
		}
		if m := p.r.sessions[name]; m != nil && m.static && m.targetName != iqn {
			continue // another target's, as the Reader remembers it
		}
		s, gone, err := p.session(name)
		if err != nil {
			return nil, err
		}
		if !gone && s.TargetName == iqn {
			snap.Sessions = append(snap.Sessions, s)
		}
	}
	slices.SortFunc(snap.Sessions, func(a, b Session) int { return int(a.ID) - int(b.ID) })
	if err := p.connections(snap); err != nil {
		return nil, err
	}
	if snap.Hosts, err = p.hosts(); err != nil {
		return nil, err
	}
	// The maps over the target's disks are among their holders.
	seen := map[string]bool{}
	for _, s := range snap.Sessions {
		for _, l := range s.LUNs {
			for _, h := range l.Holders {
				if !strings.HasPrefix(h, "dm-") || seen[h] {
					continue
				}
				seen[h] = true
				m, ok, err := p.multipathMap(h)
				if err != nil {
					if _, serr := p.sys.ReadLink("block/" + h); sysfs.IsNotExist(serr) {
						continue // removed during the read
					}
					return nil, err
				}
				if ok {
					snap.Maps = append(snap.Maps, m)
				}
			}
		}
	}
	slices.SortFunc(snap.Maps, func(a, b MultipathMap) int {
		if devLess(a.Device, b.Device) {
			return -1
		}
		return 1
	})
	return snap, nil
}
