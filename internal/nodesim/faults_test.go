package nodesim

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/pathmend/pathmend/pkg/volume"
)

// faults are what the scheduler did to the node from outside pathmend,
// to be undone at quiescence.
type faults struct {
	portDown map[string]bool // NVMe port "host:port" → unreachable
	nsOff    map[string]bool // "nqn nsid" → disabled on the target
	// phantom is the target of the unreadable record in the state
	// directory; zero when there is none.
	phantom volume.Target
	// foreign counts the foreign mounts made, to name each.
	foreign int
}

var nvmePorts = []string{"127.0.0.1:4420", "127.0.0.2:4420"}

// fault injects one kernel fault, or puts or removes the unreadable
// record: a port lost or back, a controller deleted by the kernel, a
// namespace disabled or enabled on the target, an iSCSI session failed
// or recovered; or someone else mounts at a recorded path (on top of the
// stack there or under it), or unmounts what they mounted.
func (s *sim) fault() {
	s.dirty = true
	if s.faults.portDown == nil {
		s.faults.portDown, s.faults.nsOff = map[string]bool{}, map[string]bool{}
	}
	switch s.rng.IntN(8) {
	case 6:
		s.foreignMount()
		return
	case 7:
		if fl := s.mounts.ForeignLayers(); len(fl) > 0 {
			l := fl[s.rng.IntN(len(fl))]
			s.logf("operator unmounts %s at %s", l.Source, l.MountPoint)
			s.mounts.RemoveForeign(l.ID)
		}
		return
	}
	switch s.rng.IntN(6) {
	case 0, 1:
		hp := nvmePorts[s.rng.IntN(len(nvmePorts))]
		down := !s.faults.portDown[hp]
		s.faults.portDown[hp] = down
		s.faulted = true
		s.logf("FAULT port %s unreachable=%t", hp, down)
		s.kernel.SetUnreachable(hp, down)
	case 2:
		h, err := s.nvme.Read()
		if err != nil {
			s.fail("read nvme: %v", err)
		}
		var names, connecting []string
		for _, c := range h.Controllers {
			names = append(names, string(c.Name))
			if c.State != "live" {
				connecting = append(connecting, string(c.Name))
			}
		}
		if len(connecting) > 0 { // ctrl_loss_tmo ran out
			names = connecting
		}
		if len(names) == 0 {
			return
		}
		c := names[s.rng.IntN(len(names))]
		s.faulted = true
		s.logf("FAULT the kernel deletes %s", c)
		if err := s.kernel.Disconnect(c); err != nil {
			s.fail("%v", err)
		}
	case 3:
		nqn := []string{nqnA, nqnB}[s.rng.IntN(2)]
		nsid := uint32(1 + s.rng.IntN(2))
		key := fmt.Sprintf("%s %d", nqn, nsid)
		off := !s.faults.nsOff[key]
		s.faults.nsOff[key] = off
		s.faulted = true
		s.logf("FAULT namespace %s disabled=%t", key, off)
		s.kernel.SetNamespaceEnabled(nqn, nsid, !off)
	case 4:
		keys := s.host.SessionKeys()
		if len(keys) == 0 {
			return
		}
		k := keys[s.rng.IntN(len(keys))]
		sess, _ := s.host.Session(k)
		failed := sess.State == "" || sess.State == "LOGGED_IN"
		s.faulted = true
		s.logf("FAULT session %s failed=%t", k, failed)
		if _, err := s.host.SetSessionFailed(k, failed); err != nil {
			s.fail("%v", err)
		}
		s.changed(false, true)
	case 5:
		if s.faults.phantom != (volume.Target{}) {
			s.removePhantom()
		}
	}
}

// putPhantom writes the unreadable record: a record of a newer pathmend
// found by this one after a rollback, i.e. when the process starts (one
// that turns unreadable under a running operation is not refused by it:
// the operation checked its co-tenants when it began).
func (s *sim) putPhantom() {
	if s.faults.phantom != (volume.Target{}) {
		return
	}
	{
		t := []volume.Target{s.vols[0].target, s.vols[3].target}[s.rng.IntN(2)]
		s.logf("UNREADABLE record of %s for %s", phantom, t.Name)
		s.setPhantom(t)
		env := map[string]any{"version": volume.RecordVersion + 7, "volumeID": phantom, "context": map[string]any{
			"transport": t.Transport, "nvme": map[string]string{"nqn": t.Name}, "iscsi": map[string]string{"iqn": t.Name}}}
		if t.Transport == volume.TransportNVMeTCP {
			delete(env["context"].(map[string]any), "iscsi")
		} else {
			delete(env["context"].(map[string]any), "nvme")
		}
		b, _ := json.Marshal(env)
		if err := os.WriteFile(s.phantomPath(), b, 0o600); err != nil {
			s.fail("%v", err)
		}
		s.changed(true, false)
	}
}

func (s *sim) phantomPath() string {
	store, err := volume.NewStore(s.stateDir)
	if err != nil {
		s.fail("%v", err)
	}
	return store.RecordPath(phantom)
}

// removePhantom is an operator removing the unreadable record.
func (s *sim) removePhantom() {
	s.logf("operator removes the unreadable record of %s", phantom)
	s.setPhantom(volume.Target{})
	if err := os.Remove(s.phantomPath()); err != nil {
		s.fail("%v", err)
	}
	s.changed(true, false)
}

// healFaults ends every fault: ports reachable, namespaces enabled,
// sessions logged in, the unreadable record removed.
func (s *sim) healFaults() {
	for _, hp := range nvmePorts {
		if s.faults.portDown[hp] {
			s.logf("port %s back", hp)
			s.kernel.SetUnreachable(hp, false)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(s.faults.nsOff)) {
		if s.faults.nsOff[key] {
			var nqn string
			var nsid uint32
			fmt.Sscanf(key, "%s %d", &nqn, &nsid)
			s.logf("namespace %s enabled", key)
			s.kernel.SetNamespaceEnabled(nqn, nsid, true)
		}
	}
	s.faults.portDown, s.faults.nsOff = nil, nil
	for _, k := range s.host.SessionKeys() {
		if sess, _ := s.host.Session(k); sess.State == "FAILED" {
			s.logf("session %s recovers", k)
			if _, err := s.host.SetSessionFailed(k, false); err != nil {
				s.fail("%v", err)
			}
			s.changed(false, true)
		}
	}
	if s.faults.phantom != (volume.Target{}) {
		s.removePhantom()
	}
	for _, l := range s.mounts.ForeignLayers() {
		s.logf("operator unmounts %s at %s", l.Source, l.MountPoint)
		s.mounts.RemoveForeign(l.ID)
	}
	s.dirty = true
}

// foreignMount has someone else mount a tmpfs at a random recorded path
// (a staging path, a publication) or the kubelet directory above them,
// on top of what is there or slid under it. pathmend must never unmount
// it (the table reports every unmount of a foreign layer: a violation).
func (s *sim) foreignMount() {
	paths := []string{filepath.Join(s.root, "kubelet")}
	for _, r := range s.records() {
		paths = append(paths, r.StagingPath)
		for _, p := range r.Publications {
			paths = append(paths, p.TargetPath)
		}
	}
	p := paths[s.rng.IntN(len(paths))]
	if _, err := os.Stat(p); err != nil {
		return
	}
	beneath := s.rng.IntN(2) == 0
	s.faults.foreign++
	src := fmt.Sprintf("foreign-%d", s.faults.foreign)
	s.logf("FAULT someone mounts %s at %s (beneath=%t)", src, p, beneath)
	s.stats.foreignMounted()
	s.mounts.Foreign(p, "tmpfs", src, beneath)
}

// setPhantom sets the phantom's target under the lock actors read it with.
func (s *sim) setPhantom(t volume.Target) {
	s.mu.Lock()
	s.faults.phantom = t
	s.mu.Unlock()
}
