package iscsitest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
)

// Random returns a node with up to sessions sessions drawn from r: two
// portals per target, one to three LUNs per target seen through every
// portal, each bound to a disk or not yet, connections up or not, and a
// multipath map over the disks of each LUN, or an LVM volume instead.
func Random(r *rand.Rand, sessions int) Topology {
	var t Topology
	for len(t.Sessions) < sessions {
		login(r, &t, fmt.Sprintf("iqn.2024-01.io.pathmend.test:t%d", len(t.Sessions)), 1+r.IntN(3))
	}
	for range r.IntN(3) {
		changeSession(r, &t)
	}
	for range 1 + r.IntN(2) {
		changeMap(r, &t)
	}
	return t
}

// Change applies one kernel change drawn from r to a copy of t and
// returns the changed topology and what the change was: sessions failing
// (FAILED, then FREE with their disks transport-offline) and logging in
// again, connections flapping, logouts and logins (a new session ID, the
// lowest free host and disk names), recovery_tmo and initiatorname
// writes, target_id going to -1 mid-logout, LUNs added, removed,
// unbound, resized and rescanned with another WWID, maps added, removed,
// renamed, re-created and gaining or losing slaves, a session re-created
// under its ID with other attributes, and nothing at all.
func Change(r *rand.Rand, t Topology) (Topology, string) {
	t = t.Clone()
	for {
		if what, ok := iscsiChanges[r.IntN(len(iscsiChanges))](r, &t); ok {
			return t, what
		}
	}
}

var iscsiChanges = []func(*rand.Rand, *Topology) (string, bool){
	func(*rand.Rand, *Topology) (string, bool) { return "nothing", true },
	changeSession,
	changeSession,
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onSession(r, t, func(s *Session) string {
			n := max(s.Conns, 1)
			s.ConnStates = make([]string, n)
			for c := range n {
				s.ConnStates[c] = pick(r, "up", "failed", "down", "bound")
			}
			return fmt.Sprintf("connections %v", s.ConnStates)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onSession(r, t, func(s *Session) string {
			s.RecoveryTmo = pick(r, 5, 120, 600)
			s.TargetID = pick(r, "0", "-1")
			s.Initiator = pick(r, "", "iqn.2004-10.com.example:renamed")
			return fmt.Sprintf("recovery_tmo %d, target_id %s, initiatorname %q", s.RecoveryTmo, s.TargetID, s.Initiator)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		i, ok := randomSession(r, t)
		if !ok {
			return "", false
		}
		return logout(t, i), true
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return login(r, t, fmt.Sprintf("iqn.2024-01.io.pathmend.test:login%d", nextID(t)), 1+r.IntN(2)), true
	},
	// A session re-created under its ID: the kernel never reuses one,
	// but an identity must tell the two apart regardless.
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onSession(r, t, func(s *Session) string {
			s.Gen++
			s.Target += "-again"
			s.Address = pick(r, "192.0.2.7", "2001:db8::7")
			s.TPGT, s.Iface = 2, "iface1"
			s.Conns = 1 + r.IntN(2)
			s.ConnStates = nil
			return fmt.Sprintf("session%d re-created for %s", s.ID, s.Target)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onLUN(r, t, func(_ *Session, l *LUN) string {
			l.State = pick(r, "running", "blocked", "transport-offline", "offline")
			return "LUN state " + l.State
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onLUN(r, t, func(_ *Session, l *LUN) string {
			l.Sectors = 2048 * int64(1+r.IntN(64))
			l.WWID = pick(r, l.WWID, "naa.6001405"+strconv.Itoa(r.IntN(1e6)))
			return fmt.Sprintf("LUN rescanned: %d sectors, wwid %s", l.Sectors, l.WWID)
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onLUN(r, t, func(s *Session, l *LUN) string {
			if l.Disk == "" {
				l.Disk = freeDisk(t)
				return "disk " + l.Disk + " bound"
			}
			d := l.Disk
			l.Disk = ""
			dropSlave(t, d)
			return "disk " + d + " unbound"
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onSession(r, t, func(s *Session) string {
			n := 0
			for slices.ContainsFunc(s.LUNs, func(l LUN) bool { return l.LUN == n }) {
				n++
			}
			s.LUNs = append(s.LUNs, LUN{LUN: n, Disk: freeDisk(t), WWID: "naa.6001405" + strconv.Itoa(r.IntN(1e6)), Minor: r.IntN(256)})
			return "LUN " + strconv.Itoa(n) + " added"
		})
	},
	func(r *rand.Rand, t *Topology) (string, bool) {
		return onLUN(r, t, func(s *Session, l *LUN) string {
			n, d := l.LUN, l.Disk
			s.LUNs = slices.DeleteFunc(s.LUNs, func(x LUN) bool { return x.LUN == n })
			dropSlave(t, d)
			return "LUN " + strconv.Itoa(n) + " removed"
		})
	},
	changeMap,
}

// changeSession moves a session along its life: LOGGED_IN → FAILED (its
// connections failed, its disks blocked) → FREE (disks
// transport-offline) → LOGGED_IN again.
func changeSession(r *rand.Rand, t *Topology) (string, bool) {
	return onSession(r, t, func(s *Session) string {
		var lun string
		switch s.State {
		case "LOGGED_IN", "":
			s.State, s.ConnState, lun = "FAILED", "failed", "blocked"
		case "FAILED":
			s.State, lun = "FREE", "transport-offline"
		default:
			s.State, s.ConnState, lun = "LOGGED_IN", "up", "running"
		}
		s.ConnStates = nil
		for i := range s.LUNs {
			s.LUNs[i].State = lun
		}
		return fmt.Sprintf("session%d %s", s.ID, s.State)
	})
}

// login adds a session to target with luns LUNs: the next session ID,
// the lowest free host number and disk names, as the kernel numbers them.
func login(r *rand.Rand, t *Topology, target string, luns int) string {
	s := Session{ID: nextID(t), Host: freeHost(t), Target: target, Address: pick(r, "192.0.2.1", "192.0.2.2"),
		TPGT: 1, RecoveryTmo: pick(r, 5, 120), Conns: 1 + r.IntN(2)}
	for l := range luns {
		lun := LUN{LUN: l, WWID: fmt.Sprintf("naa.6001405%06d", r.IntN(1e6)), Minor: r.IntN(256)}
		if r.IntN(5) != 0 {
			lun.Disk = freeDisk(&Topology{Sessions: append(slices.Clone(t.Sessions), s)})
		}
		s.LUNs = append(s.LUNs, lun)
	}
	t.Sessions = append(t.Sessions, s)
	return fmt.Sprintf("session%d logged in to %s", s.ID, target)
}

func logout(t *Topology, i int) string {
	s := t.Sessions[i]
	for _, l := range s.LUNs {
		dropSlave(t, l.Disk)
	}
	t.Sessions = slices.Delete(t.Sessions, i, i+1)
	return fmt.Sprintf("session%d logged out", s.ID)
}

// changeMap adds a map over some disks, or changes or removes one.
func changeMap(r *rand.Rand, t *Topology) (string, bool) {
	var disks []string
	for _, s := range t.Sessions {
		for _, l := range s.LUNs {
			if l.Disk != "" {
				disks = append(disks, l.Disk)
			}
		}
	}
	if len(t.Maps) == 0 || r.IntN(4) == 0 {
		n := 0
		for slices.ContainsFunc(t.Maps, func(m Map) bool { return m.Device == "dm-"+strconv.Itoa(n) }) {
			n++
		}
		m := Map{Device: "dm-" + strconv.Itoa(n), Name: "mpath" + strconv.Itoa(n)}
		if r.IntN(5) == 0 {
			m.UUID = "LVM-" + strconv.Itoa(n)
		}
		for _, d := range disks {
			if r.IntN(3) == 0 {
				m.Slaves = append(m.Slaves, d)
			}
		}
		t.Maps = append(t.Maps, m)
		return m.Device + " created", true
	}
	i := r.IntN(len(t.Maps))
	m := &t.Maps[i]
	switch r.IntN(5) {
	case 0:
		dev := m.Device
		t.Maps = slices.Delete(t.Maps, i, i+1)
		return dev + " removed", true
	case 1:
		// A rename keeps the UUID, which the kernel sets once.
		if m.UUID == "" {
			m.UUID = mpathUUID(m.Name)
		}
		m.Name = "renamed-" + strconv.Itoa(r.IntN(100))
		m.Sectors = 2048 * int64(1+r.IntN(64))
		return m.Device + " renamed " + m.Name, true
	case 2:
		m.Gen++
		m.Name, m.UUID = "again"+strconv.Itoa(m.Gen), pick(r, "", "LVM-again")
		return m.Device + " re-created", true
	case 3:
		m.Holders = pick(r, []string{}, []string{"dm-9"})
		return fmt.Sprintf("%s holders %v", m.Device, m.Holders), true
	}
	if len(disks) == 0 {
		return "", false
	}
	d := disks[r.IntN(len(disks))]
	if slices.Contains(m.Slaves, d) {
		m.Slaves = slices.DeleteFunc(m.Slaves, func(s string) bool { return s == d })
		return m.Device + " lost slave " + d, true
	}
	m.Slaves = append(m.Slaves, d)
	return m.Device + " gained slave " + d, true
}

// dropSlave removes a disk that went away from every map.
func dropSlave(t *Topology, disk string) {
	if disk == "" {
		return
	}
	for i := range t.Maps {
		t.Maps[i].Slaves = slices.DeleteFunc(t.Maps[i].Slaves, func(s string) bool { return s == disk })
	}
}

func nextID(t *Topology) int {
	id := 1
	for _, s := range t.Sessions {
		id = max(id, s.ID+1)
	}
	return id
}

func freeHost(t *Topology) int {
	h := 0
	for slices.ContainsFunc(t.Sessions, func(s Session) bool { return s.Host == h }) {
		h++
	}
	return h
}

// freeDisk is the lowest disk name no LUN uses: sda, sdb, …, sdz, sdaa.
func freeDisk(t *Topology) string {
	used := map[string]bool{}
	for _, s := range t.Sessions {
		for _, l := range s.LUNs {
			used[l.Disk] = true
		}
	}
	for n := 0; ; n++ {
		name := "sd"
		if n >= 26 {
			name += string(rune('a' + n/26 - 1))
		}
		name += string(rune('a' + n%26))
		if !used[name] {
			return name
		}
	}
}

func randomSession(r *rand.Rand, t *Topology) (int, bool) {
	if len(t.Sessions) == 0 {
		return 0, false
	}
	return r.IntN(len(t.Sessions)), true
}

func onSession(r *rand.Rand, t *Topology, f func(*Session) string) (string, bool) {
	i, ok := randomSession(r, t)
	if !ok {
		return "", false
	}
	return f(&t.Sessions[i]), true
}

func onLUN(r *rand.Rand, t *Topology, f func(*Session, *LUN) string) (string, bool) {
	var with []int
	for i, s := range t.Sessions {
		if len(s.LUNs) > 0 {
			with = append(with, i)
		}
	}
	if len(with) == 0 {
		return "", false
	}
	s := &t.Sessions[with[r.IntN(len(with))]]
	l := &s.LUNs[r.IntN(len(s.LUNs))]
	return fmt.Sprintf("session%d LUN %d: %s", s.ID, l.LUN, f(s, l)), true
}

func pick[T any](r *rand.Rand, choices ...T) T { return choices[r.IntN(len(choices))] }
