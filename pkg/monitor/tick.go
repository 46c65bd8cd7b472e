package monitor

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Report is what one tick saw and did. Outcomes, Connects, Skipped and
// Intents are those of the jobs the tick found finished: with a
// synchronous runner its own, otherwise also earlier ticks' jobs that
// finished since.
type Report struct {
	Volumes  int
	Defects  []heal.Defect
	Outcomes []heal.Outcome
	// Connects lists the endpoints connected, "nqn endpoint".
	Connects []string
	// Skipped lists endpoints and targets left alone and why (backoff,
	// unreachable, connect failed, target busy).
	Skipped []string
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

// Tick runs one pass: read the records and sysfs once → plan which
// targets need work (interrupted intents, defects, missing paths of
// staged volumes) → start one job per such target with its lease → read
// the finished jobs → update status and metrics → iSCSI sessions →
// compare each staged volume's device with its namespace's or LUN's.
func (m *Monitor) Tick(ctx context.Context) Report {
	start := m.deps.Clock.Now()
	var rep Report
	l, scanErr := m.deps.Intents.Scan()
	if scanErr != nil {
		klog.ErrorS(scanErr, "Staged-volume records could not be listed")
	}
	m.reportUnreadable(l, &rep)
	recs := l.Records
	rep.Volumes = len(recs)
	m.reportOrphans(recs, &rep)

	var exps, staged []nvme.Expectation
	byID := map[string]volume.Record{}
	for _, r := range recs {
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			exps = append(exps, e)
			if r.State == volume.StateStaged {
				staged = append(staged, e)
				byID[r.VolumeID] = r
			}
		}
	}
	healing := m.deps.Policy.Mode() != heal.ModeOff
	need := map[volume.Target]bool{}
	notes := map[string][]string{}
	var host *nvme.Host
	var idx *nvme.Index
	if healing && len(exps) > 0 {
		h, err := m.nvme.Read()
		if err != nil {
			klog.ErrorS(err, "Read NVMe state failed; skipping this tick's NVMe passes")
		} else {
			host, idx = h, nvme.NewIndex(h)
		}
	}
	if host != nil {
		rep.Defects = nvme.Inspect(host, exps)
		counts := map[heal.Kind]int{}
		for _, d := range rep.Defects {
			counts[d.Kind]++
			if nqn := defectNQN(host, d); nqn != "" {
				need[volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}] = true
			}
		}
		m.deps.Metrics.SetDefects(string(volume.TransportNVMeTCP), counts)
		m.planReconnects(idx, staged, need, notes, &rep)
		m.planAlign(host, staged, byID, need)
	} else {
		m.deps.Metrics.SetDefects(string(volume.TransportNVMeTCP), nil)
	}
	if healing && m.deps.Reconciler != nil && scanErr == nil {
		for _, t := range m.deps.Reconciler.Due(l) {
			need[t] = true
		}
	}
	// Only targets some record names are acted on: the kernel objects of
	// targets pathmend did not stage are not its to repair.
	targets := make([]volume.Target, 0, len(need))
	for t := range need {
		if len(l.Of(t).Records) > 0 {
			targets = append(targets, t)
		}
	}
	slices.SortFunc(targets, volume.Target.Compare)
	for _, t := range targets {
		started, busy := m.deps.Intents.Go(ctx, t, "monitor", m.job)
		if started {
			continue
		}
		rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: busy: %s", t, busy))
		for _, r := range l.Of(t).Records {
			notes[r.VolumeID] = append(notes[r.VolumeID], "repair and reconnect deferred: "+t.String()+" busy: "+busy)
		}
	}

	changed := m.collect(&rep, notes)
	inUse := map[string]bool{}
	for _, e := range exps {
		for _, ep := range e.Endpoints {
			inUse[e.NQN+" "+ep.String()] = true
		}
	}
	m.back.prune(inUse)
	slices.Sort(rep.Connects)
	slices.Sort(rep.Skipped)
	if healing && len(staged) > 0 {
		// Read again only when a job changed the kernel's state; a
		// healthy tick reads sysfs once.
		if idx == nil || changed {
			if h, err := m.nvme.Read(); err == nil {
				idx = nvme.NewIndex(h)
			}
		}
		if idx != nil {
			m.updateStatus(idx, staged, notes)
			m.trackEndpoints(idx.Host(), staged)
			host = idx.Host()
		}
	} else {
		m.forgetAll()
		host = nil
	}
	if m.deps.Sessions != nil {
		m.deps.Sessions.Tick(ctx, recs, l.Err())
	}
	rep.Replaced = m.checkStaged(stagedRecords(recs), host)
	rep.Filesystems = m.checkFilesystems(stagedRecords(recs))
	end := m.deps.Clock.Now()
	m.deps.Metrics.ObserveTick(end.Sub(start), end)
	m.mu.Lock()
	m.lastTick = end
	m.mu.Unlock()
	return rep
}

// planReconnects notes, for every staged volume, the missing endpoints a
// job would reconnect; a target with one that is not backed off, or that
// is backed off for not answering (the job rechecks it with a probe
// bounded by RecheckTimeout), needs a job. Endpoints backed off after a
// failed connect are reported here, with no job and no lock.
func (m *Monitor) planReconnects(idx *nvme.Index, staged []nvme.Expectation, need map[volume.Target]bool, notes map[string][]string, rep *Report) {
	now := m.deps.Clock.Now()
	for _, e := range staged {
		t := volume.Target{Transport: volume.TransportNVMeTCP, Name: e.NQN}
		for _, ep := range e.Endpoints {
			if idx.Covered(e.NQN, ep) {
				continue
			}
			if m.deps.Policy.Mode() != heal.ModeRepair {
				need[t] = true
				continue
			}
			if ok, until, lastErr, recheck := m.back.ready(e.NQN+" "+ep.String(), now); !ok {
				if recheck {
					// Silent when last tried: the job rechecks it with a
					// short probe, so it is reconnected once it answers.
					need[t] = true
					continue
				}
				s := fmt.Sprintf("%s: backed off until %s (%s)", ep, until.Format("15:04:05"), lastErr)
				rep.Skipped = append(rep.Skipped, s)
				notes[e.VolumeID] = append(notes[e.VolumeID], "reconnect "+s)
				continue
			}
			need[t] = true
		}
	}
}

// defectNQN is the subsystem NQN whose controllers a defect's teardown
// releases; "" when it releases none.
func defectNQN(h *nvme.Host, d heal.Defect) string {
	for _, p := range d.Teardown {
		if c, ok := h.Controller(nvme.ControllerName(p.Name)); ok {
			return c.SubsysNQN
		}
	}
	return ""
}

// collect reads the finished jobs into rep and notes, counts their
// verdicts, and reports whether any changed the kernel.
func (m *Monitor) collect(rep *Report, notes map[string][]string) (changed bool) {
	m.mu.Lock()
	done := m.done
	m.done = nil
	m.mu.Unlock()
	slices.SortFunc(done, func(a, b jobResult) int { return a.target.Compare(b.target) })
	for _, r := range done {
		rep.Outcomes = append(rep.Outcomes, r.outcomes...)
		rep.Connects = append(rep.Connects, r.connects...)
		rep.Skipped = append(rep.Skipped, r.skipped...)
		rep.Intents = append(rep.Intents, r.intents...)
		for id, n := range r.notes {
			notes[id] = append(notes[id], n...)
		}
		if r.target.Transport == volume.TransportNVMeTCP {
			m.deps.Metrics.ObserveOutcomes(string(volume.TransportNVMeTCP), r.outcomes)
		}
		changed = changed || len(r.connects) > 0 || anyRemoved(r.outcomes) || len(r.intents) > 0
	}
	return changed
}

func anyRemoved(outs []heal.Outcome) bool {
	for _, o := range outs {
		if len(o.Removed) > 0 || o.Verdict == heal.Repaired {
			return true
		}
	}
	return false
}

// updateStatus records what the tick saw per staged volume and feeds the
// path metrics. Notes of a volume a job did not report on this tick are
// kept from the last tick that had some.
func (m *Monitor) updateStatus(idx *nvme.Index, exps []nvme.Expectation, notes map[string][]string) {
	status := map[string]VolumeStatus{}
	for _, e := range exps {
		pr := idx.ReportPaths(e)
		status[e.VolumeID] = VolumeStatus{Paths: pr, Notes: notes[e.VolumeID]}
		m.deps.Metrics.SetVolumePaths(e.VolumeID, string(volume.TransportNVMeTCP), pr.Expected, pr.Live, pr.Optimized)
	}
	m.mu.Lock()
	for id := range m.status {
		if _, ok := status[id]; !ok {
			m.deps.Metrics.ForgetVolume(id)
		}
	}
	m.status = status
	m.mu.Unlock()
}

func verdictWord(v heal.Verdict) string {
	if v == heal.Deferred {
		return "repair deferred"
	}
	return string(v)
}

// forgetAll drops the status and metric series of every volume, and the
// endpoints it found unreachable: no NVMe volume is staged (or healing is
// off).
func (m *Monitor) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.status {
		m.deps.Metrics.ForgetVolume(id)
	}
	m.status = map[string]VolumeStatus{}
	m.endpoints = nil
	m.reach.prune(nil)
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
