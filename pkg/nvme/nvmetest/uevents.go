package nvmetest

import (
	"fmt"
	"strconv"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// Uevents returns the uevents the kernel sends when what the host shows
// goes from old to new, in the order the lab's 6.1 kernel sends them
// (testdata/uevents; docs/uevents.md), numbered from *seq on:
//
//   - a head gone: "remove block nvme<S>n<H>" (below its subsystem); then
//     a controller gone: "remove nvme nvme<C>"; then a subsystem with no
//     controller left: "remove nvme-subsystem nvme-subsys<S>";
//   - a controller created: "add nvme nvme<C>", then "add nvme-subsystem"
//     when its subsystem is new, then, once live, "change nvme nvme<C>"
//     with NVME_EVENT=connected; a head created: "add block";
//   - a controller that is live again after a reset or a reconnect: a
//     "change block" of each head of its subsystem, then "change nvme"
//     with NVME_EVENT=connected.
//
// Nothing else is announced: not a controller that stops answering (it
// goes connecting silently), not an ANA state, not a leg.
func Uevents(old, new Topology, seq *uint64) []uevent.Event {
	var out []uevent.Event
	emit := func(action uevent.Action, devpath, subsystem string, kv ...string) {
		*seq++
		env := map[string]string{"ACTION": string(action), "DEVPATH": devpath, "SUBSYSTEM": subsystem, "SEQNUM": strconv.FormatUint(*seq, 10)}
		for i := 0; i+1 < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		out = append(out, uevent.Event{Seq: *seq, Action: action, DevPath: devpath, Subsystem: subsystem, Env: env})
	}
	subsysPath := func(s Subsystem) string {
		return "/devices/virtual/nvme-subsystem/nvme-subsys" + strconv.Itoa(s.Instance)
	}
	headPath := func(s Subsystem, ns Namespace) string {
		return subsysPath(s) + "/nvme" + strconv.Itoa(s.Instance) + "n" + strconv.Itoa(ns.Head)
	}
	ctrlPath := func(c Controller) string { return "/devices/virtual/nvme-fabrics/ctl/nvme" + strconv.Itoa(c.Instance) }
	ctrlEnv := func(c Controller) []string {
		return []string{"NVME_TRTYPE", "tcp", "NVME_TRADDR", c.Traddr, "NVME_TRSVCID", c.Trsvcid, "NVME_HOST_TRADDR", "none", "NVME_HOST_IFACE", "none"}
	}
	live := func(c Controller) bool { return c.State == "" || c.State == "live" }

	oldSub, newSub := subsystemsByKey(old), subsystemsByKey(new)
	for _, s := range old.Subsystems {
		n, kept := newSub[subKey(s)]
		for _, ns := range s.Namespaces {
			if !kept || !hasHead(n, ns) {
				emit(uevent.Remove, headPath(s, ns), "block", "DEVTYPE", "disk", "DEVNAME", "nvme"+strconv.Itoa(s.Instance)+"n"+strconv.Itoa(ns.Head))
			}
		}
		for _, c := range s.Controllers {
			if !kept || !hasController(n, c) {
				emit(uevent.Remove, ctrlPath(c), "nvme", ctrlEnv(c)...)
			}
		}
		if !kept {
			emit(uevent.Remove, subsysPath(s), "nvme-subsystem")
		}
	}
	for _, s := range new.Subsystems {
		o, had := oldSub[subKey(s)]
		for i, c := range s.Controllers {
			prev, existed := controllerIn(o, c)
			switch {
			case !existed:
				emit(uevent.Add, ctrlPath(c), "nvme", ctrlEnv(c)...)
				if !had && i == 0 {
					emit(uevent.Add, subsysPath(s), "nvme-subsystem")
				}
				if live(c) {
					emit(uevent.Change, ctrlPath(c), "nvme", append(ctrlEnv(c), "NVME_EVENT", "connected")...)
				}
			case !live(prev) && live(c):
				for _, ns := range s.Namespaces {
					if hasHead(o, ns) {
						emit(uevent.Change, headPath(s, ns), "block", "DEVTYPE", "disk")
					}
				}
				emit(uevent.Change, ctrlPath(c), "nvme", append(ctrlEnv(c), "NVME_EVENT", "connected")...)
			}
		}
		for _, ns := range s.Namespaces {
			if !had || !hasHead(o, ns) {
				emit(uevent.Add, headPath(s, ns), "block", "DEVTYPE", "disk", "DEVNAME", "nvme"+strconv.Itoa(s.Instance)+"n"+strconv.Itoa(ns.Head))
			}
		}
	}
	return out
}

// subKey names a subsystem object: a subsystem created again under its
// instance number is another object.
func subKey(s Subsystem) string { return fmt.Sprintf("%d/%d/%s", s.Instance, s.Gen, s.NQN) }

func subsystemsByKey(t Topology) map[string]Subsystem {
	out := make(map[string]Subsystem, len(t.Subsystems))
	for _, s := range t.Subsystems {
		out[subKey(s)] = s
	}
	return out
}

func hasHead(s Subsystem, ns Namespace) bool {
	for _, x := range s.Namespaces {
		if x.Head == ns.Head && x.Gen == ns.Gen {
			return true
		}
	}
	return false
}

func hasController(s Subsystem, c Controller) bool {
	_, ok := controllerIn(s, c)
	return ok
}

func controllerIn(s Subsystem, c Controller) (Controller, bool) {
	for _, x := range s.Controllers {
		if x.Instance == c.Instance && x.Gen == c.Gen {
			return x, true
		}
	}
	return Controller{}, false
}
