// Package observe watches the kernel from outside pathmend: it samples
// sysfs (through pathmend's own read models, which the lab proves equal
// to the kernel's state) and turns the samples into what the soak
// reports — when each path of each volume was up, when every path of a
// volume was down at once, and every controller or session that went
// away together with the last state it was seen in. It knows nothing of
// the faults or of pathmend's decisions; the report attributes what it
// saw.
package observe

import (
	"fmt"
	"strconv"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
)

// PathSpec is one path a volume should have: an NVMe endpoint or an iSCSI
// portal.
type PathSpec struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	Port int    `json:"port"`
}

// VolumeSpec is what the soak staged: where the volume lives and which
// paths it should have.
type VolumeSpec struct {
	ID string `json:"id"`
	// NQN and NSID for NVMe; IQN and LUN for iSCSI.
	NQN   string     `json:"nqn,omitempty"`
	NSID  uint32     `json:"nsid,omitempty"`
	IQN   string     `json:"iqn,omitempty"`
	LUN   int        `json:"lun,omitempty"`
	Paths []PathSpec `json:"paths"`
}

// ISCSI reports whether the volume is an iSCSI volume.
func (v VolumeSpec) ISCSI() bool { return v.IQN != "" }

// PathState is one path of one volume in one sample.
type PathState struct {
	Up bool `json:"up"`
	// Detail says what was seen: "nvme3 live optimized", "nvme3
	// connecting", "no controller", "session4 FAILED", …
	Detail string `json:"detail"`
}

// Object is a controller or session seen in a sample.
type Object struct {
	// Key identifies this instance across samples: a controller name
	// and its creation time (names are reused at once), a session name
	// (session numbers are not reused while the machine runs).
	Key  string `json:"key"`
	Name string `json:"name"`
	// Target is its NQN or IQN, Endpoint its addr:port.
	Target   string `json:"target"`
	Endpoint string `json:"endpoint"`
	State    string `json:"state"`
	// Healthy: live (LOGGED_IN) and carrying I/O for everything its
	// subsystem (session) exports: an ANA-usable leg to every namespace
	// of its subsystem, or every LUN running with a disk.
	Healthy bool `json:"healthy"`
	// Why says what keeps it from being healthy.
	Why string `json:"why,omitempty"`
}

// Sample is one look at the kernel.
type Sample struct {
	At time.Time
	// Paths maps "volume/path" to the path's state.
	Paths map[string]PathState
	// Devices maps a volume to its block device ("nvme0n1 259:1",
	// "dm-0 253:0"); "" when it has none.
	Devices map[string]string
	// Objects maps Key to every controller and session.
	Objects map[string]Object
	// Err is set when the kernel could not be read; the sample is then
	// empty and ignored.
	Err error
}

// PathKey is the key of a volume's path in Sample.Paths.
func PathKey(volume, path string) string { return volume + "/" + path }

// Take builds a sample from one read of NVMe and iSCSI state.
func Take(at time.Time, host *nvme.Host, snap *iscsi.Snapshot, vols []VolumeSpec) Sample {
	s := Sample{At: at, Paths: map[string]PathState{}, Devices: map[string]string{}, Objects: map[string]Object{}}
	if host != nil {
		nvmeObjects(host, s.Objects)
	}
	if snap != nil {
		iscsiObjects(snap, s.Objects)
	}
	for _, v := range vols {
		if v.ISCSI() {
			iscsiVolume(snap, v, s)
		} else {
			nvmeVolume(host, v, s)
		}
	}
	return s
}

func nvmeObjects(h *nvme.Host, out map[string]Object) {
	subs := map[nvme.SubsystemName]*nvme.Subsystem{}
	for i := range h.Subsystems {
		subs[h.Subsystems[i].Name] = &h.Subsystems[i]
	}
	for _, c := range h.Controllers {
		o := Object{
			Key:  fmt.Sprintf("%s@%d", c.Name, c.CreatedAt.UnixNano()),
			Name: string(c.Name), Target: c.SubsysNQN,
			Endpoint: endpointOf(&c), State: string(c.State),
		}
		o.Healthy, o.Why = controllerHealthy(c, subs[c.Subsystem])
		out[o.Key] = o
	}
}

// controllerHealthy: live, its subsystem exports at least one namespace,
// and it has a usable leg to every one of them.
func controllerHealthy(c nvme.Controller, s *nvme.Subsystem) (bool, string) {
	if c.State != nvme.StateLive {
		return false, "state " + string(c.State)
	}
	if s == nil || len(s.Namespaces) == 0 {
		return false, "its subsystem exports no namespace"
	}
	for _, ns := range s.Namespaces {
		leg := false
		for _, p := range ns.Paths {
			if p.Controller == c.Name {
				if !p.ANAState.Usable() {
					return false, fmt.Sprintf("leg to nsid %d %s", ns.NSID, p.ANAState)
				}
				leg = true
			}
		}
		if !leg {
			return false, fmt.Sprintf("no leg to nsid %d", ns.NSID)
		}
	}
	return true, ""
}

func nvmeVolume(h *nvme.Host, v VolumeSpec, s Sample) {
	var ns *nvme.Namespace
	var sub *nvme.Subsystem
	if h != nil {
		for i := range h.Subsystems {
			for j := range h.Subsystems[i].Namespaces {
				if h.Subsystems[i].NQN == v.NQN && h.Subsystems[i].Namespaces[j].NSID == v.NSID {
					sub, ns = &h.Subsystems[i], &h.Subsystems[i].Namespaces[j]
				}
			}
		}
	}
	if ns != nil {
		s.Devices[v.ID] = string(ns.Head)
	} else {
		s.Devices[v.ID] = ""
	}
	for _, p := range v.Paths {
		st := PathState{Detail: "no controller"}
		if h != nil {
			for _, c := range h.Controllers {
				if c.SubsysNQN != v.NQN || c.Address.Traddr != p.Addr || c.Address.Trsvcid != strconv.Itoa(p.Port) {
					continue
				}
				st = PathState{Detail: fmt.Sprintf("%s %s", c.Name, c.State)}
				if ns == nil {
					st.Detail += ", no namespace"
					continue
				}
				for _, leg := range ns.Paths {
					if leg.Controller == c.Name {
						st.Detail += " " + string(leg.ANAState)
						if c.State == nvme.StateLive && leg.ANAState.Usable() {
							st.Up = true
						}
					}
				}
				if sub != nil && !st.Up && c.State == nvme.StateLive && !hasLeg(ns, c.Name) {
					st.Detail += ", no leg"
				}
				if st.Up {
					break
				}
			}
		}
		s.Paths[PathKey(v.ID, p.ID)] = st
	}
}

func hasLeg(ns *nvme.Namespace, c nvme.ControllerName) bool {
	for _, p := range ns.Paths {
		if p.Controller == c {
			return true
		}
	}
	return false
}

func iscsiObjects(snap *iscsi.Snapshot, out map[string]Object) {
	for _, x := range snap.Sessions {
		o := Object{
			Key: x.ID.String(), Name: x.ID.String(), Target: x.TargetName,
			Endpoint: x.PortalString(), State: string(x.State),
		}
		o.Healthy, o.Why = sessionHealthy(snap, x)
		out[o.Key] = o
	}
}

func sessionHealthy(snap *iscsi.Snapshot, x iscsi.Session) (bool, string) {
	if !x.State.LoggedIn() {
		return false, "state " + string(x.State)
	}
	if len(x.LUNs) == 0 {
		return false, "no LUN"
	}
	for _, l := range x.LUNs {
		if !l.Running() || l.Disk == "" {
			return false, fmt.Sprintf("LUN %d %s, disk %q", l.Address.LUN, l.State, l.Disk)
		}
	}
	return true, ""
}

func iscsiVolume(snap *iscsi.Snapshot, v VolumeSpec, s Sample) {
	s.Devices[v.ID] = ""
	for _, p := range v.Paths {
		st := PathState{Detail: "no session"}
		if snap != nil {
			for _, x := range snap.SessionsOf(v.IQN) {
				addr, port, ok := x.Portal()
				if !ok || addr != p.Addr || port != p.Port {
					continue
				}
				st = PathState{Detail: fmt.Sprintf("%s %s", x.ID, x.State)}
				l, ok := x.LUN(v.LUN)
				switch {
				case !ok || l.Disk == "":
					st.Detail += fmt.Sprintf(", no disk for LUN %d", v.LUN)
				case !l.Running():
					st.Detail += fmt.Sprintf(", %s %s", l.Disk, l.State)
				default:
					m, inMap := snap.MapOf(l.Disk)
					if !inMap {
						st.Detail += fmt.Sprintf(", %s in no multipath map", l.Disk)
						break
					}
					s.Devices[v.ID] = m.Device
					st.Detail += fmt.Sprintf(", %s in %s", l.Disk, m.Device)
					st.Up = x.State.LoggedIn()
				}
				if st.Up {
					break
				}
			}
		}
		s.Paths[PathKey(v.ID, p.ID)] = st
	}
}

// endpointOf is "traddr:trsvcid" of a controller, or what the reader says
// when it has not seen the controller live: the observer's reader, like
// pathmend's, reads address only while a controller is live.
func endpointOf(c *nvme.Controller) string {
	if c.AddressUnknown {
		return nvme.AddressNotKnown
	}
	return c.Address.Traddr + ":" + c.Address.Trsvcid
}
