package monitor

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Report is what one tick saw and did. Outcomes, Connects, Skipped and
// Intents include those of the jobs the tick found finished: with a
// synchronous runner its own, otherwise also earlier ticks' jobs that
// finished since.
type Report struct {
	// Volumes counts the records of the node.
	Volumes  int
	Defects  []heal.Defect
	Outcomes []heal.Outcome
	// Connects lists the endpoints connected, "nqn endpoint".
	Connects []string
	// Skipped lists endpoints and targets left alone and why (backoff,
	// unreachable, connect failed, target busy).
	Skipped []string
	// Events are what the transports' reads changed in what they
	// remember (a learned endpoint given up, forgotten).
	Events []string
	// Orphans are volumes whose staging path no longer exists.
	Orphans []string
	// Intents are the reconciliation verdicts on interrupted intents.
	Intents []intent.Verdict
	// Unreadable are the record files that could not be read.
	Unreadable []string
	// Replaced are staged volumes whose users hold a device the kernel
	// replaced.
	Replaced []string
	// Filesystems are the staged volumes whose filesystem is not healthy
	// (errors, read-only, shut down), each "volumeID: summary".
	Filesystems []string
}

// Tick runs one pass: read the records → every transport reads the
// kernel once and plans → one job per target that needs work, with its
// lease (interrupted intents first, in the owned scope) → read the
// finished jobs → every transport reports its volumes as they are now →
// compare each staged volume's device with the one its users hold → read
// each staged filesystem's health → write the model and the metrics.
func (m *Monitor) Tick(ctx context.Context) Report {
	start := m.deps.Clock.Now()
	var rep Report
	gen := m.deps.Intents.Generation()
	l, scanErr := m.deps.Intents.Scan()
	m.ev.recorded, m.ev.recordedGen = recordedTargets(l, scanErr), gen
	if scanErr != nil {
		klog.ErrorS(scanErr, "Staged-volume records could not be listed")
	}
	m.reportUnreadable(l, &rep)
	rep.Volumes = len(l.Records)
	if m.cfg.Scope.Owned {
		m.reportOrphans(l.Records, &rep)
	}
	r := model.Round{Listing: l, ListErr: scanErr, Owned: m.cfg.Scope.Owned, Foreign: m.cfg.Scope.Foreign,
		Stamp: m.deps.Model.Stamp(start)}

	holders := map[volume.Target]string{}
	for _, tr := range m.deps.Transports {
		p := tr.Plan(ctx, r)
		rep.Defects = append(rep.Defects, p.Defects...)
		rep.Skipped = append(rep.Skipped, p.Skipped...)
		rep.Events = append(rep.Events, p.Events...)
		for _, w := range p.Work {
			if _, ok := holders[w.Target]; !ok {
				holders[w.Target] = w.Holder
			}
		}
	}
	healing := m.deps.Policy.Mode() != heal.ModeOff
	if healing && m.cfg.Scope.Owned && m.deps.Reconciler != nil && scanErr == nil {
		for _, t := range m.deps.Reconciler.Due(l) {
			if _, ok := holders[t]; !ok {
				holders[t] = "monitor"
			}
		}
	}
	targets := make([]volume.Target, 0, len(holders))
	for t := range holders {
		targets = append(targets, t)
	}
	slices.SortFunc(targets, volume.Target.Compare)
	busy := map[volume.Transport]map[volume.Target]string{}
	for _, t := range targets {
		tr := m.tr[t.Transport]
		if tr == nil || !healing {
			continue
		}
		started, holder := m.deps.Intents.Go(ctx, t, holders[t], m.job(tr))
		if started {
			continue
		}
		rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: busy: %s", t, holder))
		if busy[t.Transport] == nil {
			busy[t.Transport] = map[volume.Target]string{}
		}
		busy[t.Transport][t] = holder
	}

	done := m.collect(&rep)
	var vols []model.Volume
	node := map[string][]volume.Condition{}
	for _, tr := range m.deps.Transports {
		name := tr.Name()
		fin := tr.Finish(ctx, r, model.Jobs{Done: done[name], Busy: busy[name]})
		m.deps.Metrics.SetDefects(string(name), fin.Defects)
		m.deps.Metrics.ObserveOutcomes(string(name), fin.Outcomes)
		rep.Outcomes = append(rep.Outcomes, fin.Outcomes...)
		vols = append(vols, fin.Volumes...)
		node[string(name)] = fin.Node
	}
	slices.Sort(rep.Connects)
	slices.Sort(rep.Skipped)
	rep.Replaced, rep.Filesystems = m.commit(r, vols, node)
	return rep
}

// job is the work on one target with its lease: the interrupted intents
// of an owned target first, then the transport's job.
func (m *Monitor) job(tr Transport) func(context.Context, *intent.Lease) {
	return func(ctx context.Context, lease *intent.Lease) {
		var res jobResult
		if m.cfg.Scope.Owned && m.deps.Reconciler != nil {
			res.intents = m.deps.Reconciler.Reconcile(ctx, lease)
		}
		res.Result = tr.Job(ctx, lease)
		res.Target = lease.Target()
		res.Changed = res.Changed || len(res.intents) > 0
		m.mu.Lock()
		m.done = append(m.done, res)
		m.mu.Unlock()
	}
}

// collect reads the finished jobs into rep, counts their verdicts, and
// returns them by transport.
func (m *Monitor) collect(rep *Report) map[volume.Transport][]model.Result {
	m.mu.Lock()
	done := m.done
	m.done = nil
	m.mu.Unlock()
	slices.SortFunc(done, func(a, b jobResult) int { return a.Target.Compare(b.Target) })
	out := map[volume.Transport][]model.Result{}
	for _, r := range done {
		rep.Outcomes = append(rep.Outcomes, r.Outcomes...)
		rep.Connects = append(rep.Connects, r.Connects...)
		rep.Skipped = append(rep.Skipped, r.Skipped...)
		rep.Intents = append(rep.Intents, r.intents...)
		m.deps.Metrics.ObserveOutcomes(string(r.Target.Transport), r.Outcomes)
		out[r.Target.Transport] = append(out[r.Target.Transport], r.Result)
	}
	return out
}

// reportOrphans logs, once per volume, records whose staging path is gone:
// the volume was probably unstaged while pathmend was down. They are kept
// and still healed: only NodeUnstage (or the reconciliation of an
// interrupted intent) removes a record.
func (m *Monitor) reportOrphans(recs []volume.Record, rep *Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range recs {
		if r.State != volume.StateStaged || r.StagingPath == "" || m.deps.PathExists(r.StagingPath) {
			continue
		}
		seen[r.VolumeID] = true
		rep.Orphans = append(rep.Orphans, r.VolumeID)
		if !m.orphans[r.VolumeID] {
			klog.InfoS("Staged volume's staging path is gone; its record is kept until NodeUnstage", "volumeID", r.VolumeID, "stagingPath", r.StagingPath)
		}
	}
	m.orphans = seen
}

// reportUnreadable logs each record file that cannot be read (once per
// change of what is wrong with it) and lists them in the report. Nothing
// of a target such a file may belong to is torn down (intent.Lease).
func (m *Monitor) reportUnreadable(l volume.Listing, rep *Report) {
	for _, u := range l.Unreadable {
		rep.Unreadable = append(rep.Unreadable, u.Path)
		if m.gate.Should(u.Path, u.Err.Error()) {
			klog.ErrorS(u, "Staged-volume record cannot be read: no teardown of its target until it is readable or removed (docs/state.md)",
				"file", u.Path, "volumeID", u.VolumeID, "target", u.Target.String())
		}
	}
	m.gate.Prune()
}

// recordedTargets is the set of targets a record of l names, readable or
// not; nil when that cannot be told (the listing failed, or a file names
// no target).
func recordedTargets(l volume.Listing, err error) map[volume.Target]bool {
	if err != nil {
		return nil
	}
	out := make(map[volume.Target]bool, len(l.Records))
	for _, r := range l.Records {
		out[r.Target()] = true
	}
	for _, u := range l.Unreadable {
		if u.Target == (volume.Target{}) {
			return nil
		}
		out[u.Target] = true
	}
	return out
}
