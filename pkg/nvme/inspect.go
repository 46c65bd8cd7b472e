package nvme

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
)

// DiagnosedTransport is the only transport Inspect reports defects for:
// pathmend attaches NVMe/TCP and leaves controllers of other transports
// (local PCIe drives, RDMA or FC attached by someone else) alone.
const DiagnosedTransport = "tcp"

// Inspect decides, from one Host and without waiting for anything, which
// defects the host's NVMe/TCP paths have. want are the staged volumes'
// expectations; with none (a bare node) the defects that need a volume are
// not reported. Inspect never mutates h and returns defects in a stable
// order: by subsystem NQN, then AmbiguousHead, NoNamespace,
// NamespaceMissing, then controller-scope defects in controller order.
//
// A false positive tears down live paths, so every rule reports only what
// the kernel publishes positively, and a subsystem Inspect is not sure
// about yields nothing: a subsystem that changed during the read
// (Host.Skipped), a discovery subsystem, one with a controller of another
// transport, and an NQN answered by several instances of which not exactly
// one has a usable path. The rules are documented in doc.go.
func Inspect(h *Host, want []Expectation) []heal.Defect {
	in := newInspection(h, want)
	var out []heal.Defect
	for _, nqn := range in.nqns {
		out = append(out, in.inspectNQN(nqn)...)
	}
	return out
}

// inspection is the index one Inspect call works from.
type inspection struct {
	ctrl      map[ControllerName]*Controller
	unsettled map[SubsystemName]bool
	byNQN     map[string][]*Subsystem
	nqns      []string
	want      map[string][]*Expectation
}

func newInspection(h *Host, want []Expectation) *inspection {
	in := &inspection{
		ctrl:      make(map[ControllerName]*Controller, len(h.Controllers)),
		unsettled: make(map[SubsystemName]bool),
		byNQN:     make(map[string][]*Subsystem, len(h.Subsystems)),
		want:      make(map[string][]*Expectation),
	}
	for i := range h.Controllers {
		in.ctrl[h.Controllers[i].Name] = &h.Controllers[i]
	}
	for _, s := range h.Skipped {
		if s.Subsystem != "" {
			in.unsettled[s.Subsystem] = true
		}
	}
	for i := range h.Subsystems {
		s := &h.Subsystems[i]
		if s.Discovery() {
			continue
		}
		if _, seen := in.byNQN[s.NQN]; !seen {
			in.nqns = append(in.nqns, s.NQN)
		}
		in.byNQN[s.NQN] = append(in.byNQN[s.NQN], s)
	}
	slices.Sort(in.nqns)
	for i := range want {
		in.want[want[i].NQN] = append(in.want[want[i].NQN], &want[i])
	}
	return in
}

// diagnosable reports whether Inspect may decide anything about s: it is
// settled and every member controller is a readable NVMe/TCP controller.
func (in *inspection) diagnosable(s *Subsystem) bool {
	if in.unsettled[s.Name] {
		return false
	}
	for _, name := range s.Controllers {
		if c := in.ctrl[name]; c == nil || c.Transport != DiagnosedTransport {
			return false
		}
	}
	return true
}

// volumes lists the IDs of the staged volumes on nqn.
func (in *inspection) volumes(nqn string) []string {
	var ids []string
	for _, e := range in.want[nqn] {
		ids = append(ids, e.VolumeID)
	}
	return uniqueSorted(ids)
}

// inspectNQN applies every rule to the subsystem instances answering nqn.
func (in *inspection) inspectNQN(nqn string) []heal.Defect {
	subs := in.byNQN[nqn]
	if slices.ContainsFunc(subs, func(s *Subsystem) bool { return !in.diagnosable(s) }) {
		return nil
	}
	var out []heal.Defect
	primary := subs[0]
	if len(subs) > 1 {
		var usable []*Subsystem
		for _, s := range subs {
			if in.hasUsablePath(s) {
				usable = append(usable, s)
			}
		}
		if len(usable) != 1 {
			return nil // none or several usable: no instance is clearly stale
		}
		primary = usable[0]
		for _, s := range subs {
			if s != primary {
				out = append(out, in.ambiguousHead(s, primary))
			}
		}
	}
	if d, ok := in.noNamespace(primary); ok {
		out = append(out, d)
	}
	if d, ok := in.namespaceMissing(primary); ok {
		out = append(out, d)
	}
	for _, name := range primary.Controllers {
		if d, ok := in.controllerDefect(primary, in.ctrl[name]); ok {
			out = append(out, d)
		}
	}
	return out
}

// ambiguousHead reports stale, an instance without any usable path that
// answers the same NQN as primary, the one instance with usable paths.
// Its namespaces are the subject of the defect, not co-tenants: they are
// the wrong block devices a lookup by NQN may return.
func (in *inspection) ambiguousHead(stale, primary *Subsystem) heal.Defect {
	var devs []string
	for i := range stale.Namespaces {
		for _, d := range stale.Namespaces[i].Devices() {
			devs = append(devs, string(d))
		}
	}
	detail := fmt.Sprintf("%s is answered by %s and %s; %s has no usable path", stale.NQN, primary.Name, stale.Name, stale.Name)
	if len(devs) > 0 {
		detail += " (block devices " + strings.Join(devs, ", ") + ")"
	}
	if len(stale.Controllers) == 0 {
		detail += " and no controller"
	}
	return heal.Defect{
		Kind:     heal.AmbiguousHead,
		Scope:    heal.ScopeSubsystem,
		Subject:  string(stale.Name) + " (" + stale.NQN + ")",
		Key:      string(stale.Name),
		Teardown: in.teardown(stale, stale.Controllers, nil),
		Volumes:  in.volumes(stale.NQN),
		Detail:   detail,
	}
}

// noNamespace reports a subsystem with a live controller that exports no
// namespace at all.
func (in *inspection) noNamespace(s *Subsystem) (heal.Defect, bool) {
	if len(s.Namespaces) > 0 || !in.anyLive(s) {
		return heal.Defect{}, false
	}
	return heal.Defect{
		Kind:     heal.NoNamespace,
		Scope:    heal.ScopeSubsystem,
		Subject:  string(s.Name) + " (" + s.NQN + ")",
		Key:      s.NQN,
		Teardown: in.teardown(s, s.Controllers, nil),
		Volumes:  in.volumes(s.NQN),
		Detail:   fmt.Sprintf("%s has %s, %s live, and exports no namespace", s.Name, plural(len(s.Controllers), "controller"), liveCount(in, s)),
	}, true
}
