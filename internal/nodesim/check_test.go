package nodesim

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// records reads the records of the node; the unreadable record the
// scheduler put there is left out, any other unreadable one is a
// violation. It reads the state directory again only after a record
// was written or deleted.
func (s *sim) records() []volume.Record {
	s.mu.Lock()
	epoch, cached, ok := s.recEpoch, s.recCache, s.recCacheAt == s.recEpoch
	s.mu.Unlock()
	if ok {
		return cached
	}
	store, err := volume.NewStore(s.stateDir)
	if err != nil {
		s.fail("%v", err)
	}
	l, err := store.Scan()
	if err != nil {
		s.fail("%v", err)
	}
	for _, u := range l.Unreadable {
		if u.VolumeID != phantom {
			s.fail("unreadable record: %v", u)
		}
	}
	s.mu.Lock()
	if s.recEpoch == epoch {
		s.recCache, s.recCacheAt = l.Records, epoch
	}
	s.mu.Unlock()
	return l.Records
}

// changed notes that an actor or the scheduler changed the records
// (recs) or the iSCSI host (iscsi).
func (s *sim) changed(recs, iscsi bool) {
	s.mu.Lock()
	if recs {
		s.recEpoch++
	}
	if iscsi {
		s.iscsiEpoch++
	}
	s.mu.Unlock()
}

// check tests what must hold after every step: every record parses; no
// actor broke an invariant at a seam; an acknowledged staged volume
// loses a live path only to a fault (no RPC for it is in flight, so an
// action for another volume or by the monitor would be the cause).
func (s *sim) check() {
	s.mu.Lock()
	errs := s.seamErr
	s.seamErr = nil
	s.mu.Unlock()
	if len(errs) > 0 {
		s.fail("%s", strings.Join(errs, "; "))
	}
	if !s.dirty {
		return
	}
	s.dirty = false
	s.records()
	var h *nvme.Host
	for _, v := range s.vols {
		if v.stage != done || v.busy {
			delete(s.live, v.id)
			continue
		}
		// The live paths are counted again only when what they are
		// counted from changed: the NVMe tree, or the iSCSI host.
		s.mu.Lock()
		at := s.iscsiEpoch
		s.mu.Unlock()
		if v.target.Transport == volume.TransportNVMeTCP {
			at = s.kernel.Generation()
		}
		prev, ok := s.live[v.id]
		if ok && prev.at == at {
			continue
		}
		if h == nil && v.target.Transport == volume.TransportNVMeTCP {
			var err error
			if h, err = s.nvme.Read(); err != nil {
				s.fail("read nvme: %v", err)
			}
		}
		live, why := s.livePaths(h, v)
		if ok && live < prev.live && !s.faulted {
			s.fail("staged volume %s went from %d to %d live paths, and no fault was injected: %s", v.id, prev.live, live, why)
		}
		s.live[v.id] = counted{live, at}
	}
	s.faulted = false
}

// counted is a volume's live paths, counted at a generation of what
// they are counted from.
type counted struct{ live, at int }

// livePaths counts a volume's live paths the way its attacher does, and
// says what is wrong.
func (s *sim) livePaths(h *nvme.Host, v *vol) (int, string) {
	c, _, err := volume.Parse(v.vc, nil)
	if err != nil {
		s.fail("%v", err)
	}
	rec := volume.Record{VolumeID: v.id, Context: c}
	if v.target.Transport == volume.TransportNVMeTCP {
		e, _ := nvme.ExpectationFromRecord(rec)
		p := nvme.ReportPaths(h, e)
		return p.Live, nvme.ConditionOf(p).Message
	}
	cond := s.proc.iscsi.Health(context.Background(), rec)
	var live, want int
	if _, err := fmt.Sscanf(cond.Message, "%d of %d portals logged in", &live, &want); err != nil {
		s.fail("iSCSI health %q: %v", cond.Message, err)
	}
	return live, cond.Message
}

// needs reports whether a readable record on disk that is attaching or
// staged lists endpoint (host:port) of target: what a connect or a login
// must have, so a volume whose unstage began (detaching) or was
// acknowledged (gone) is never connected again for its own sake.
func (s *sim) needs(target volume.Target, endpoint string) bool {
	for _, r := range s.records() {
		if r.Target() != target || r.State == volume.StateDetaching {
			continue
		}
		for _, ep := range endpoints(r) {
			if ep == endpoint {
				return true
			}
		}
	}
	return false
}

// endpoints lists a record's endpoints or portals as host:port.
func endpoints(r volume.Record) []string {
	var out []string
	if n := r.Context.NVMe; n != nil {
		for _, ep := range n.Endpoints {
			out = append(out, ep.String())
		}
	}
	if i := r.Context.ISCSI; i != nil {
		for _, ep := range i.Portals {
			out = append(out, ep.String())
		}
	}
	return out
}

// teardown is an actor about to tear down something of target: a
// violation while an unreadable record names the target.
func (s *sim) teardown(target volume.Target, what string) {
	if s.phantomTarget() == target {
		s.violation("%s while the unreadable record of %s names %s", what, phantom, target.Name)
	}
}

// phantomTarget reads the phantom's target under the lock: actors call
// it while the scheduler waits.
func (s *sim) phantomTarget() volume.Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.phantom
}

// checkQuiescent: the kernel holds exactly what the records need, and no
// interrupted intent is left but one whose device is in use. A staged
// record needs every endpoint it lists; an attaching one kept because
// its device is in use (the CO never came back to finish its stage) may
// keep what it has — the monitor does not complete an interrupted stage,
// a retried NodeStage does.
func (s *sim) checkQuiescent() {
	need := map[string]map[string]bool{} // NQN or IQN → endpoints/portals
	may := map[string]map[string]bool{}  // the same, of attaching records
	for _, r := range s.records() {
		if r.State == volume.StateDetaching {
			s.fail("record of %s left detaching at quiescence", r.VolumeID)
		}
		if r.State == volume.StateAttaching {
			if mounted, _ := s.mounts.IsMountPoint(r.StagingPath); !mounted {
				s.fail("record of %s left attaching with nothing using it", r.VolumeID)
			}
		}
		t := r.Target()
		m := need
		if r.State == volume.StateAttaching {
			m = may
		}
		if m[t.Name] == nil {
			m[t.Name] = map[string]bool{}
		}
		for _, ep := range endpoints(r) {
			m[t.Name][ep] = true
		}
	}
	h, err := s.nvme.Read()
	if err != nil {
		s.fail("%v", err)
	}
	for _, nqn := range []string{nqnA, nqnB} {
		got := map[string]int{}
		for _, c := range h.Controllers {
			if c.SubsysNQN == nqn {
				if c.State != "live" {
					s.fail("controller %s of %s is %s at quiescence", c.Name, nqn, c.State)
				}
				got[c.Endpoint().String()[len("tcp "):]]++
			}
		}
		for ep, n := range got {
			if !need[nqn][ep] && !may[nqn][ep] || n != 1 {
				s.fail("%s: %d controllers to %s, records need %v", nqn, n, ep, need[nqn])
			}
		}
		for ep := range need[nqn] {
			if got[ep] == 0 {
				s.fail("%s: no controller to %s the records need", nqn, ep)
			}
		}
	}
	for what, got := range map[string][]string{"sessions": s.host.SessionKeys(), "node records": s.host.RecordKeys()} {
		for _, k := range got {
			if ep := strings.TrimPrefix(k, iqnT+","); !need[iqnT][ep] && !may[iqnT][ep] {
				s.fail("%s %v, records need %v (attaching ones may keep %v)", what, got, need[iqnT], may[iqnT])
			}
		}
		for ep := range need[iqnT] {
			if !slices.Contains(got, iqnT+","+ep) {
				s.fail("%s %v, records need %v", what, got, need[iqnT])
			}
		}
	}
	for _, v := range s.vols {
		if v.stage == done {
			if live, why := s.livePaths(h, v); live < 2 {
				s.fail("staged volume %s has %d of 2 live paths at quiescence: %s", v.id, live, why)
			}
		}
	}
}
