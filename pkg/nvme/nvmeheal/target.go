package nvmeheal

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// TargetOf names the subsystem a kernel object the model does not know
// serves — a controller or a subsystem instance created since the last
// read (a reconnect, a namespace back under a new head) — from its
// subsysnqn attribute: one read. The kernel fixes a controller's and a
// subsystem's NQN for their life, so the answer cannot go stale while the
// object lives; a gone object has no answer.
func (t *Transport) TargetOf(o uevent.Object) (volume.Target, bool) {
	var rel string
	switch o.Kind {
	case uevent.NVMeController:
		rel = "class/nvme/" + o.Name + "/subsysnqn" // class/nvme/<ctrl>/subsysnqn
	case uevent.NVMeSubsystem:
		rel = "class/nvme-subsystem/" + o.Name + "/subsysnqn" // class/nvme-subsystem/<subsys>/subsysnqn
	default:
		return volume.Target{}, false
	}
	nqn, err := t.deps.SysFS.ReadAttr(rel)
	if err != nil || nqn == "" || nqn == nvme.DiscoveryNQN {
		return volume.Target{}, false
	}
	return nvmeTarget(nqn), true
}

// Notice drops the class listings the reader keeps for PlanTarget
// (nvme.Reader.Forget) when b lost events, or added or removed (or
// renamed) a controller or a subsystem instance: the objects a kept
// listing would not show, or would show though gone. Every other event
// leaves them (a change, a block device: below a subsystem or a
// controller, whose directories every read lists afresh).
func (t *Transport) Notice(b uevent.Batch) {
	if len(b.Lost) > 0 {
		t.reader.Forget()
		return
	}
	for _, e := range b.Events {
		if classChange(e) {
			t.reader.Forget()
			return
		}
	}
}

// classChange reports whether e adds, removes or renames an entry of
// class/nvme or class/nvme-subsystem.
func classChange(e uevent.Event) bool {
	switch e.Action {
	case uevent.Add, uevent.Remove, uevent.Move:
		return e.Subsystem == "nvme" || e.Subsystem == "nvme-subsystem"
	}
	return false
}

// PlanTarget reads subsystem r.Target's objects only
// (nvme.Reader.ReadTarget) and plans it as Plan plans a tick, for that
// subsystem alone: owned, a defect, a missing path of a staged volume
// that is not backed off (or is, for not answering), a controller whose
// timeouts are not aligned; foreign, after learning from the read
// (companion.Learner.LearnTarget), a defect or a learned endpoint to
// connect again. It returns the subsystem's volumes as the read found
// them. It decides nothing a job decides: the job reads again under the
// lease and runs the policy (grace, cooldown, co-tenants).
func (t *Transport) PlanTarget(ctx context.Context, r model.TargetRound) model.TargetPlan {
	var p model.TargetPlan
	if t.deps.Policy.Mode() == heal.ModeOff || r.Target.Transport != volume.TransportNVMeTCP {
		return p
	}
	nqn := r.Target.Name
	switch {
	case r.Owned:
		return t.planOwnedTarget(r, nqn)
	case r.Foreign && t.cfg.Foreign != nil:
		return t.planForeignTarget(nqn, r)
	}
	return p
}

func (t *Transport) planOwnedTarget(r model.TargetRound, nqn string) model.TargetPlan {
	var p model.TargetPlan
	exps, staged, byID := expectations(r.Listing.Records)
	var mine []nvme.Expectation
	for _, e := range staged {
		if e.NQN == nqn {
			mine = append(mine, e)
		}
	}
	if len(exps) == 0 {
		p.Why = "no staged-volume record of the subsystem"
		return p
	}
	host, kept, err := t.reader.PeekTarget(nqn)
	if err == nil && kept {
		// From the class listings the reader kept: trusted when it finds
		// every path live and nothing to do; anything missing or wrong
		// is confirmed on a read that lists them again, and that read is
		// what is planned and written.
		if p = t.planOwnedHost(r, nqn, host, exps, mine, byID); p.Holder == "" && len(p.Defects) == 0 && p.Revisit.IsZero() && allWell(p.Volumes) && len(host.Skipped) == 0 {
			return p
		}
		host, err = t.reader.ReadTarget(nqn)
	}
	if err != nil {
		p = model.TargetPlan{Why: "read failed: " + err.Error()}
		klog.ErrorS(err, "Read of an NVMe subsystem after a kernel event failed; the tick reads it again", "nqn", nqn)
		return p
	}
	return t.planOwnedHost(r, nqn, host, exps, mine, byID)
}

// allWell reports whether every volume is healthy, every path of it
// live, and no volume has a note.
func allWell(vols []model.Volume) bool {
	for _, v := range vols {
		if len(v.Notes) > 0 || v.Condition.Abnormal() {
			return false
		}
		for _, p := range v.Paths {
			if p.State != model.PathLive {
				return false
			}
		}
	}
	return true
}

// planOwnedHost plans owned subsystem nqn from host, a read of its
// objects.
func (t *Transport) planOwnedHost(r model.TargetRound, nqn string, host *nvme.Host, exps, mine []nvme.Expectation, byID map[string]*volume.Record) model.TargetPlan {
	p := model.TargetPlan{Read: true}
	idx := nvme.NewIndex(host)
	holders := map[volume.Target]string{}
	var why []string
	for _, d := range nvme.Inspect(host, exps) {
		if nvme.TeardownNQN(host, d) != nqn {
			continue
		}
		p.Defects = append(p.Defects, d)
		holders[r.Target] = HolderOwned
		why = append(why, string(d.Kind)+" "+d.Key)
	}
	notes := map[string][]string{}
	skipped, next := t.planReconnects(idx, mine, holders, notes)
	if m := missingPaths(idx, mine); len(m) > 0 {
		why = append(why, "missing paths: "+strings.Join(m, ", "))
	}
	if len(skipped) > 0 {
		why = append(why, "backed off: "+strings.Join(skipped, "; "))
		p.Revisit = next
	}
	had := len(holders) > 0
	t.planAlign(idx, mine, byID, holders, false)
	if !had && len(holders) > 0 {
		why = append(why, "timeouts to align")
	}
	p.Holder = holders[r.Target]
	if len(why) == 0 {
		why = append(why, "every path of its staged volumes live")
	}
	p.Why = strings.Join(why, "; ")
	for _, e := range mine {
		v := t.volumeOf(idx, e)
		v.Notes = notes[e.VolumeID]
		p.Volumes = append(p.Volumes, v)
	}
	return p
}

// missingPaths lists the endpoints of exps no controller serves.
func missingPaths(idx *nvme.Index, exps []nvme.Expectation) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range exps {
		for _, ep := range e.Endpoints {
			if s := ep.String(); !idx.Covered(e.NQN, ep) && !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// planForeignTarget learns from a read of subsystem nqn and plans it as
// planForeign does: a defect, or a learned endpoint to connect again
// that is not backed off.
func (t *Transport) planForeignTarget(nqn string, r model.TargetRound) model.TargetPlan {
	var p model.TargetPlan
	read := t.cfg.Foreign.BeginRead()
	host, err := t.reader.ReadTarget(nqn)
	if err != nil {
		p.Why = "read failed: " + err.Error()
		klog.ErrorS(err, "Read of an NVMe subsystem after a kernel event failed; the tick reads it again", "nqn", nqn)
		return p
	}
	p.Read = true
	own := companion.OwnerOf(r.Listing)
	sub, ok, events := t.cfg.Foreign.LearnTarget(host, nqn, own, read, t.deps.Clock.Now())
	companion.LogEvents(events)
	if !ok {
		p.Why = "not a learned subsystem"
		return p
	}
	var why []string
	for _, d := range nvme.Inspect(host, nil) {
		if nvme.TeardownNQN(host, d) != nqn {
			continue
		}
		p.Defects = append(p.Defects, d)
		p.Holder = HolderForeign
		why = append(why, string(d.Kind)+" "+d.Key)
	}
	now := t.deps.Clock.Now()
	for _, e := range sub.Endpoints {
		if !e.WantsConnect() {
			continue
		}
		ok, until, lastErr, recheck := t.back.Ready(nqn+" "+e.String(), now)
		if !ok && !recheck {
			why = append(why, fmt.Sprintf("%s backed off until %s (%s)", e.String(), until.Format(time.TimeOnly), lastErr))
			if p.Revisit.IsZero() || until.Before(p.Revisit) {
				p.Revisit = until
			}
			continue
		}
		p.Holder = HolderForeign
		why = append(why, e.String()+" to connect again")
	}
	if len(why) == 0 {
		why = append(why, "every learned path present")
	}
	p.Why = strings.Join(why, "; ")
	p.Volumes = []model.Volume{foreignVolume(nvme.NewIndex(host), sub)}
	return p
}
