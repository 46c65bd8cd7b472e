package monitor

import (
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// aligned is a controller instance whose timeouts were brought to want.
type aligned struct {
	created time.Time
	want    nvme.Timeouts
}

// alignTimeouts brings every present controller of a staged NVMe/TCP
// volume to the volume's effective timeouts (its context's, else
// pathmend's defaults; nvme.TimeoutsOf), and sets delayed_removal_secs of
// its head where the kernel offers it. Linux 6.1 lets all three timeouts
// change on a live controller, so a controller connected before — by an
// older pathmend with the kernel's defaults, or by hand — stops being one
// the kernel would give up on. Repair mode only: it changes the kernel's
// settings. A controller shared by volumes whose timeouts differ is left
// alone and logged once.
//
// The tick's read does not carry the timeouts (nvme.ScopePaths), and
// nothing but a write changes them: each controller instance (name and
// creation time) is read and aligned once, and again only when the
// timeouts its volumes want change; each head is looked at once while it
// exists.
func (m *Monitor) alignTimeouts(host *nvme.Host, exps []nvme.Expectation, recs map[string]volume.Record) {
	if m.deps.Policy.Mode() != heal.ModeRepair {
		return
	}
	targets := make([]nvme.TuneTarget, 0, len(exps))
	for _, e := range exps {
		targets = append(targets, nvme.TuneTarget{Expectation: e, Timeouts: nvme.TimeoutsOf(recs[e.VolumeID].Context.NVMe)})
	}
	want, conflicts := nvme.ControllerTimeouts(host, targets)
	seen := make(map[nvme.ControllerName]bool, len(want))
	for name, w := range want {
		seen[name] = true
		c, ok := host.Controller(name)
		if !ok {
			continue
		}
		if a, ok := m.aligned[name]; ok && a.created.Equal(c.CreatedAt) && a.want == w {
			continue
		}
		tunes, err := nvme.TimeoutTunesOf(m.deps.SysFS, name, w)
		if err != nil {
			klog.V(2).InfoS("Could not read a controller's timeouts", "controller", name, "err", err)
			continue
		}
		done := m.apply(tunes)
		if done == len(tunes) {
			m.aligned[name] = aligned{created: c.CreatedAt, want: w}
		}
	}
	for name := range m.aligned {
		if !seen[name] {
			delete(m.aligned, name)
		}
	}
	heads := map[nvme.DeviceName]bool{}
	for _, t := range targets {
		loc, err := nvme.Locate(host, t.Expectation)
		if err != nil || loc.Namespace.Head == "" {
			continue
		}
		head := loc.Namespace.Head
		heads[head] = true
		if m.heads[head] {
			continue
		}
		m.heads[head] = true
		if tu, ok := nvme.DelayedRemovalTune(m.deps.SysFS, head); ok {
			if m.apply([]nvme.Tune{tu}) != 1 {
				delete(m.heads, head)
			}
		}
	}
	for h := range m.heads {
		if !heads[h] {
			delete(m.heads, h)
		}
	}
	if c := strings.Join(conflicts, ","); c != m.timeoutConflicts {
		if c != "" {
			klog.InfoS("Controllers shared by volumes whose timeouts differ keep theirs", "controllers", c)
		}
		m.timeoutConflicts = c
	}
}

// apply writes tunes, logs each one written and returns how many were.
func (m *Monitor) apply(tunes []nvme.Tune) int {
	done := nvme.ApplyTunes(m.deps.SysFS, tunes)
	for _, t := range done {
		klog.InfoS("Aligned a timeout with the staged volumes", "path", t.Path, "from", t.From, "to", t.To)
	}
	return len(done)
}
