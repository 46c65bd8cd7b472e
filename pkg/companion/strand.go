package companion

import (
	"fmt"
	"slices"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
)

// Strand adds to d's co-tenants every namespace of the subsystem the
// teardown would leave with no usable path, the defect's own included:
// companion mode cannot see which namespaces another driver's workloads
// use, so it treats every one as in use. A namespace is stranded when
// the teardown removes one of its legs, no usable leg remains outside
// it, and it had a usable leg before or no leg at all remains (its block
// device would disappear).
func Strand(h *nvme.Host, d *heal.Defect) {
	gone := map[nvme.ControllerName]bool{}
	for _, p := range d.Teardown {
		gone[nvme.ControllerName(p.Name)] = true
	}
	listed := map[string]bool{}
	for _, c := range d.CoTenants {
		listed[c.Device] = true
	}
	usable := func(p nvme.Path) bool {
		c, ok := h.Controller(p.Controller)
		return ok && c.State == nvme.StateLive && p.ANAState.Usable()
	}
	for _, s := range h.Subsystems {
		if !slices.ContainsFunc(s.Controllers, func(c nvme.ControllerName) bool { return gone[c] }) {
			continue
		}
		for _, ns := range s.Namespaces {
			legsIn, legsOut, usableNow, usableOut := 0, 0, false, false
			for _, p := range ns.Paths {
				u := usable(p)
				usableNow = usableNow || u
				if gone[p.Controller] {
					legsIn++
				} else {
					legsOut++
					usableOut = usableOut || u
				}
			}
			if legsIn == 0 || usableOut || (!usableNow && legsOut > 0) {
				continue
			}
			for _, dev := range ns.Devices() {
				if !listed[string(dev)] {
					listed[string(dev)] = true
					d.CoTenants = append(d.CoTenants, heal.CoTenant{Namespace: fmt.Sprintf("%s nsid %d", s.Name, ns.NSID), Device: string(dev)})
				}
			}
		}
	}
}

// GoesTo reports whether controller c may be a path to endpoint ep: it
// goes there, or its address is unknown (it was not seen live) and it
// may.
func GoesTo(c *nvme.Controller, ep nvme.Endpoint) bool {
	return c.AddressUnknown || c.Endpoint() == ep
}
