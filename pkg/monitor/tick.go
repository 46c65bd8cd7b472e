package monitor

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Report is what one tick saw and did.
type Report struct {
	Volumes  int
	Defects  []heal.Defect
	Outcomes []heal.Outcome
	// Connects lists the endpoints connected, "nqn endpoint".
	Connects []string
	// Skipped lists endpoints left alone this tick and why (backoff,
	// unreachable, connect failed).
	Skipped []string
	// Orphans are volumes whose staging path no longer exists.
	Orphans []string
	// Replaced are volumes whose users hold a device the kernel replaced.
	Replaced []string
}

// Tick runs one pass: load records → read sysfs once → heal → subtract
// what the heal tore down → reconcile optimized → reconcile non-optimized
// (per volume, concurrently, connects bounded) → iSCSI sessions.
func (m *Monitor) Tick(ctx context.Context) Report {
	start := m.deps.Clock.Now()
	var rep Report
	recs, err := m.deps.Records()
	if err != nil {
		klog.ErrorS(err, "Some staged-volume records could not be read")
	}
	rep.Volumes = len(recs)
	m.reportOrphans(recs, &rep)

	var exps []nvme.Expectation
	byID := map[string]volume.Record{}
	for _, r := range recs {
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			exps = append(exps, e)
			byID[r.VolumeID] = r
		}
	}
	var host *nvme.Host
	if len(exps) > 0 && m.deps.Policy.Mode() != heal.ModeOff {
		host = m.nvmeTick(ctx, exps, byID, &rep)
	} else {
		m.forgetAll()
	}
	if m.deps.Sessions != nil {
		m.deps.Sessions.Tick(ctx, recs, err)
	}
	rep.Replaced = m.checkStaged(recs, host)
	end := m.deps.Clock.Now()
	m.deps.Metrics.ObserveTick(end.Sub(start), end)
	m.mu.Lock()
	m.lastTick = end
	m.mu.Unlock()
	return rep
}

// nvmeTick is the NVMe part of a tick; it returns its last read of the
// kernel's state (nil when it could not read it).
func (m *Monitor) nvmeTick(ctx context.Context, exps []nvme.Expectation, recs map[string]volume.Record, rep *Report) *nvme.Host {
	host, err := m.nvme.Read()
	if err != nil {
		klog.ErrorS(err, "Read NVMe state failed; skipping this tick")
		return nil
	}
	// 1. heal
	rep.Defects = nvme.Inspect(host, exps)
	counts := map[heal.Kind]int{}
	for _, d := range rep.Defects {
		counts[d.Kind]++
	}
	m.deps.Metrics.SetDefects(string(volume.TransportNVMeTCP), counts)
	repairer := &nvme.Repairer{Detacher: m.deps.Connector, Rescanner: m.deps.Connector, SysFS: m.deps.SysFS, Expectations: exps}
	rep.Outcomes = m.deps.Policy.Heal(ctx, rep.Defects, repairer)
	m.deps.Metrics.ObserveOutcomes(string(volume.TransportNVMeTCP), rep.Outcomes)

	// 2. subtract: a controller just deleted must not count as present,
	// or its endpoint is not reconnected and the repair bought nothing.
	removed := map[nvme.ControllerName]bool{}
	for _, o := range rep.Outcomes {
		for _, p := range o.Removed {
			removed[nvme.ControllerName(p.Name)] = true
		}
	}

	// 3, 4. reconcile optimized, then non-optimized, per volume.
	var mu sync.Mutex
	var wg sync.WaitGroup
	idx := nvme.NewIndex(host)
	notes := map[string][]string{}
	inUse := map[string]bool{}
	for _, e := range exps {
		for _, ep := range e.Endpoints {
			inUse[e.NQN+" "+ep.String()] = true
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := recs[e.VolumeID].Context.NVMe
			opt, others := nvme.OrderedEndpoints(n)
			var conn, skip, note []string
			for _, group := range [][]volume.Endpoint{opt, others} {
				c, s := m.reconcile(ctx, idx, removed, n, group)
				conn, skip = append(conn, c...), append(skip, s...)
			}
			for _, s := range skip {
				note = append(note, "reconnect "+s)
			}
			mu.Lock()
			rep.Connects = append(rep.Connects, conn...)
			rep.Skipped = append(rep.Skipped, skip...)
			notes[e.VolumeID] = note
			mu.Unlock()
		}()
	}
	wg.Wait()
	m.back.prune(inUse)
	m.trackEndpoints(idx.Host(), removed, exps)
	slices.Sort(rep.Connects)
	slices.Sort(rep.Skipped)
	// Read again only when the tick changed the kernel's state; a healthy
	// tick reads sysfs once.
	if len(rep.Connects) > 0 || anyRemoved(rep.Outcomes) {
		if h, err := m.nvme.Read(); err == nil {
			idx = nvme.NewIndex(h)
		}
	}
	m.alignTimeouts(idx.Host(), exps, recs)
	m.updateStatus(idx, exps, rep, notes)
	return idx.Host()
}

func anyRemoved(outs []heal.Outcome) bool {
	for _, o := range outs {
		if len(o.Removed) > 0 || o.Verdict == heal.Repaired {
			return true
		}
	}
	return false
}

// reconcile connects every endpoint of group that has no present
// controller. Present is any state but deleting or dead, minus what this
// tick removed: a controller the kernel is reconnecting is left to it.
func (m *Monitor) reconcile(ctx context.Context, idx *nvme.Index, removed map[nvme.ControllerName]bool, n *volume.NVMeTCP, group []volume.Endpoint) (connected, skipped []string) {
	for _, ep := range group {
		present := false
		for _, c := range idx.ControllersTo(n.NQN, ep) {
			if !removed[c.Name] {
				present = true
			}
		}
		if present {
			continue
		}
		if m.deps.Policy.Mode() != heal.ModeRepair {
			skipped = append(skipped, fmt.Sprintf("%s: %s mode: would reconnect", ep, m.deps.Policy.Mode()))
			continue
		}
		if skip := m.reconnect(ctx, idx.Host(), n, ep); skip != "" {
			skipped = append(skipped, skip)
			continue
		}
		connected = append(connected, n.NQN+" "+ep.String())
	}
	return connected, skipped
}

// connect probes the endpoint, then connects it within ConnectTimeout,
// holding one of MaxConnects slots. Secrets for DH-HMAC-CHAP come from a
// live sibling controller's sysfs attributes: records never hold secrets,
// and the kernel keeps the ones NodeStage gave it.
func (m *Monitor) connect(ctx context.Context, host *nvme.Host, n *volume.NVMeTCP, ep volume.Endpoint) error {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.sem }()
	cctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout)
	defer cancel()
	if err := m.deps.Prober.Reachable(cctx, ep.String()); err != nil {
		if refused(err) {
			return fmt.Errorf("refused: %w", err)
		}
		return fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	secrets := siblingSecrets(m, host, n.NQN)
	_, err := m.deps.Connector.Connect(cctx, nvme.ConnectOptions(n, ep, m.deps.Host, secrets))
	if err == nil {
		klog.InfoS("Reconnected path", "nqn", n.NQN, "endpoint", ep.String())
	}
	return err
}

// siblingSecrets reads the DH-HMAC-CHAP secrets of a controller of the
// same subsystem; empty when none has any.
func siblingSecrets(m *Monitor, host *nvme.Host, nqn string) volume.Secrets {
	var s volume.Secrets
	for _, c := range host.Controllers {
		if c.SubsysNQN != nqn {
			continue
		}
		dir := "class/nvme/" + string(c.Name) + "/"
		if v, ok, _ := m.deps.SysFS.ReadOptionalAttr(dir + "dhchap_secret"); ok && v != "none" {
			s.DHCHAPSecret = v
		}
		if v, ok, _ := m.deps.SysFS.ReadOptionalAttr(dir + "dhchap_ctrl_secret"); ok && v != "none" {
			s.DHCHAPCtrlSecret = v
		}
		if s.DHCHAPSecret != "" {
			return s
		}
	}
	return s
}

// updateStatus records what the tick saw per volume and feeds the path
// metrics.
func (m *Monitor) updateStatus(idx *nvme.Index, exps []nvme.Expectation, rep *Report, notes map[string][]string) {
	host := idx.Host()
	status := map[string]VolumeStatus{}
	for _, e := range exps {
		pr := idx.ReportPaths(e)
		st := VolumeStatus{Paths: pr, Notes: notes[e.VolumeID]}
		for _, o := range rep.Outcomes {
			if nvme.Concerns(host, o.Defect, e) {
				st.Notes = append(st.Notes, fmt.Sprintf("%s %s: %s", o.Defect.Kind, verdictWord(o.Verdict), o.Reason))
			}
		}
		status[e.VolumeID] = st
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

// forgetAll drops the status and metric series of every volume: no NVMe
// volume is staged (or healing is off).
func (m *Monitor) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.status {
		m.deps.Metrics.ForgetVolume(id)
	}
	m.status = map[string]VolumeStatus{}
	m.endpoints = nil
	m.reach.prune(nil)
	m.deps.Metrics.SetDefects(string(volume.TransportNVMeTCP), nil)
}

// reportOrphans logs, once per volume, records whose staging path is gone:
// the volume was probably unstaged while pathmend was down. They are kept
// and still healed: only NodeUnstage removes a record.
func (m *Monitor) reportOrphans(recs []volume.Record, rep *Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range recs {
		if r.StagingPath == "" || m.deps.PathExists(r.StagingPath) {
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
