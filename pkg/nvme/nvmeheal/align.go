package nvmeheal

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

// alignment is what the transport remembers of the timeouts it aligned:
// the controller instances and heads dealt with, and the controllers last
// logged as shared by volumes whose timeouts differ, per subsystem. The
// tick reads it to plan; jobs, one per target at a time, write it.
type alignment struct {
	aligned   map[nvme.ControllerName]aligned
	heads     map[nvme.DeviceName]bool
	conflicts map[string]string // subsystem NQN → controllers, joined
}

func newAlignment() alignment {
	return alignment{aligned: map[nvme.ControllerName]aligned{}, heads: map[nvme.DeviceName]bool{}, conflicts: map[string]string{}}
}

// tuneTargets pairs each staged volume's expectation with its effective
// timeouts (its context's, else pathmend's defaults; nvme.TimeoutsOf).
func tuneTargets(exps []nvme.Expectation, recs map[string]*volume.Record) []nvme.TuneTarget {
	targets := make([]nvme.TuneTarget, 0, len(exps))
	for _, e := range exps {
		targets = append(targets, nvme.TuneTarget{Expectation: e, Timeouts: nvme.TimeoutsOf(recs[e.VolumeID].Context.NVMe)})
	}
	return targets
}

// planAlign marks, in repair mode, the subsystems of staged volumes with a
// present controller whose timeouts differ from the ones its volumes
// want, or a head whose delayed_removal_secs is not set: their job aligns
// them under the target's lease. A controller instance (or head) it has
// not looked at yet is read once here — its three timeouts; reading
// takes no lease — and remembered as aligned when nothing differs, so a
// restarted plugin whose controllers are aligned already starts no job
// for them. A steady tick reads nothing and marks nothing. With prune (a
// read of every subsystem) it also forgets the controllers and heads
// host no longer has.
func (t *Transport) planAlign(idx *nvme.Index, exps []nvme.Expectation, recs map[string]*volume.Record, need map[volume.Target]string, prune bool) {
	if t.deps.Policy.Mode() != heal.ModeRepair {
		return
	}
	host := idx.Host()
	targets := tuneTargets(exps, recs)
	want, _ := nvme.ControllerTimeoutsIn(idx, targets)
	t.alignMu.Lock()
	defer t.alignMu.Unlock()
	for name, w := range want {
		c, ok := host.Controller(name)
		if !ok {
			continue
		}
		if a, ok := t.align.aligned[name]; ok && a.created.Equal(c.CreatedAt) && a.want == w {
			continue
		}
		if tunes, err := nvme.TimeoutTunesOf(t.deps.SysFS, name, w); err == nil && len(tunes) == 0 {
			t.align.aligned[name] = aligned{created: c.CreatedAt, want: w}
			continue
		}
		need[nvmeTarget(c.SubsysNQN)] = HolderOwned
	}
	if prune {
		// Only a tick's plan, which sees every controller, forgets; a
		// target's plan walks nothing of the others'.
		for name := range t.align.aligned {
			if _, ok := want[name]; !ok {
				delete(t.align.aligned, name)
			}
		}
	}
	heads := map[nvme.DeviceName]bool{}
	for _, tt := range targets {
		loc, err := idx.Locate(tt.Expectation)
		if err != nil || loc.Namespace.Head == "" {
			continue
		}
		head := loc.Namespace.Head
		heads[head] = true
		if t.align.heads[head] {
			continue
		}
		if _, ok := nvme.DelayedRemovalTune(t.deps.SysFS, head); !ok {
			t.align.heads[head] = true // nothing to set: the kernel has no delay, or it is set
			continue
		}
		need[nvmeTarget(tt.Expectation.NQN)] = HolderOwned
	}
	if prune {
		for h := range t.align.heads {
			if !heads[h] {
				delete(t.align.heads, h)
			}
		}
	}
}

// alignTimeouts, in a job with the lease of subsystem nqn, brings every
// present controller of its staged volumes (exps) to the volumes'
// effective timeouts, and sets delayed_removal_secs of their heads where
// the kernel offers it. Linux 6.1 lets all three timeouts change on a live
// controller, so a controller connected before — by an older pathmend with
// the kernel's defaults, or by hand — stops being one the kernel would
// give up on. Repair mode only: it changes the kernel's settings. A
// controller shared by volumes whose timeouts differ is left alone and
// logged once.
//
// Each controller instance (name and creation time) is read and aligned
// once, and again only when the timeouts its volumes want change; each
// head is looked at once while it exists.
func (t *Transport) alignTimeouts(host *nvme.Host, nqn string, exps []nvme.Expectation, recs map[string]*volume.Record) {
	if t.deps.Policy.Mode() != heal.ModeRepair {
		return
	}
	targets := tuneTargets(exps, recs)
	want, conflicts := nvme.ControllerTimeouts(host, targets)
	t.alignMu.Lock()
	defer t.alignMu.Unlock()
	for name, w := range want {
		c, ok := host.Controller(name)
		if !ok || c.SubsysNQN != nqn {
			continue
		}
		if a, ok := t.align.aligned[name]; ok && a.created.Equal(c.CreatedAt) && a.want == w {
			continue
		}
		tunes, err := nvme.TimeoutTunesOf(t.deps.SysFS, name, w)
		if err != nil {
			klog.V(2).InfoS("Could not read a controller's timeouts", "controller", name, "err", err)
			continue
		}
		if t.apply(tunes) == len(tunes) {
			t.align.aligned[name] = aligned{created: c.CreatedAt, want: w}
		}
	}
	for _, tt := range targets {
		loc, err := nvme.Locate(host, tt.Expectation)
		if err != nil || loc.Namespace.Head == "" || t.align.heads[loc.Namespace.Head] {
			continue
		}
		head := loc.Namespace.Head
		t.align.heads[head] = true
		if tu, ok := nvme.DelayedRemovalTune(t.deps.SysFS, head); ok {
			if t.apply([]nvme.Tune{tu}) != 1 {
				delete(t.align.heads, head)
			}
		}
	}
	if c := strings.Join(conflicts, ","); c != t.align.conflicts[nqn] {
		if c != "" {
			klog.InfoS("Controllers shared by volumes whose timeouts differ keep theirs", "nqn", nqn, "controllers", c)
		}
		t.align.conflicts[nqn] = c
	}
}

// apply writes tunes, logs each one written and returns how many were.
func (t *Transport) apply(tunes []nvme.Tune) int {
	done := nvme.ApplyTunes(t.deps.SysFS, tunes)
	for _, t := range done {
		klog.InfoS("Aligned a timeout with the staged volumes", "path", t.Path, "from", t.From, "to", t.To)
	}
	return len(done)
}
