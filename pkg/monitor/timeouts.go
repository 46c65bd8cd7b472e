package monitor

import (
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// alignTimeouts brings every present controller of a staged NVMe/TCP
// volume to the volume's effective timeouts (its context's, else
// pathmend's defaults; nvme.TimeoutsOf), and sets delayed_removal_secs of
// its head where the kernel offers it. Linux 6.1 lets all three timeouts
// change on a live controller, so a controller connected before — by an
// older pathmend with the kernel's defaults, or by hand — stops being one
// the kernel would give up on. Repair mode only: it changes the kernel's
// settings. A controller shared by volumes whose timeouts differ is left
// alone and logged once.
func (m *Monitor) alignTimeouts(host *nvme.Host, exps []nvme.Expectation, recs map[string]volume.Record) {
	if m.deps.Policy.Mode() != heal.ModeRepair {
		return
	}
	targets := make([]nvme.TuneTarget, 0, len(exps))
	for _, e := range exps {
		targets = append(targets, nvme.TuneTarget{Expectation: e, Timeouts: nvme.TimeoutsOf(recs[e.VolumeID].Context.NVMe)})
	}
	tunes, conflicts := nvme.TimeoutTunes(m.deps.SysFS, host, targets)
	for _, t := range nvme.ApplyTunes(m.deps.SysFS, tunes) {
		klog.InfoS("Aligned a timeout with the staged volumes", "path", t.Path, "from", t.From, "to", t.To)
	}
	slices.Sort(conflicts)
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := strings.Join(conflicts, ","); c != m.timeoutConflicts {
		if c != "" {
			klog.InfoS("Controllers shared by volumes whose timeouts differ keep theirs", "controllers", c)
		}
		m.timeoutConflicts = c
	}
}
