package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// learnedRep is one endpoint companion mode learned
// (<state-dir>/learned, docs/companion.md).
type learnedRep struct {
	NQN      string `json:"nqn"`
	Endpoint string `json:"endpoint"`
	// Controller and LastState are what companion mode last saw on it;
	// GoneSince is set when it saw no controller.
	Controller nvme.ControllerName  `json:"controller"`
	LastState  nvme.ControllerState `json:"lastState"`
	GoneSince  *time.Time           `json:"goneSince,omitempty"`
	// Status: "present", "given up" (reconnected when it answers), "torn
	// down" (by a companion repair; reconnected), per the last tick.
	Status string `json:"status"`
	// Options are the connect options a reconnect uses; no secret is
	// ever learned ("dhchap" says the endpoint authenticated).
	Options string `json:"options"`
	DHCHAP  bool   `json:"dhchap,omitempty"`
}

// learnedState is what diagnose reads of companion mode's store.
type learnedState struct {
	subs       []companion.Subsystem
	unreadable []companion.Unreadable
}

// readLearned reads the learned subsystems of stateDir, creating
// nothing; a state dir companion mode never used has none.
func readLearned(stateDir string) (learnedState, error) {
	if stateDir == "" {
		return learnedState{}, nil
	}
	s, ok, err := companion.OpenStore(stateDir)
	if err != nil || !ok {
		return learnedState{}, err
	}
	subs, bad, err := s.Load()
	if err != nil {
		return learnedState{}, err
	}
	var ls learnedState
	for _, nqn := range sortedKeys(subs) {
		ls.subs = append(ls.subs, subs[nqn])
	}
	ls.unreadable = bad
	return ls, nil
}

func sortedKeys(m map[string]companion.Subsystem) []string {
	return slices.Sorted(maps.Keys(m))
}

// addLearned lists the learned endpoints and the learned files that
// cannot be read (each blocks companion mode on its subsystem, so the
// node is not healthy).
func (r *report) addLearned(ls learnedState) {
	for _, s := range ls.subs {
		for _, e := range s.Endpoints {
			lr := learnedRep{NQN: s.NQN, Endpoint: e.String(), Controller: e.Controller, LastState: e.LastState,
				Status: "present", Options: e.Options(s.NQN).String(), DHCHAP: e.Params.DHCHAP}
			if !e.GoneSince.IsZero() {
				g := e.GoneSince
				lr.GoneSince = &g
				lr.Status = "given up"
				if e.TornDown {
					lr.Status = "torn down"
				}
			}
			r.Learned = append(r.Learned, lr)
		}
	}
	for _, u := range ls.unreadable {
		r.UnreadableLearned = append(r.UnreadableLearned, unreadableRep{File: u.Path, Target: u.NQN, Error: u.Err.Error()})
	}
	if len(r.UnreadableLearned) > 0 {
		r.Healthy = false
	}
}

// kindReconnect is the plan kind of an endpoint companion mode would
// connect again.
const kindReconnect heal.Kind = "Reconnect"

// companionPlan splits the NVMe plan: defects of subsystems companion
// mode learned (and the node plugin does not own) are decided as
// companion mode decides them — every namespace in use — and the
// endpoints it would connect again are added; the rest as serve decides.
func companionPlan(h *nvme.Host, defects []heal.Defect, ls learnedState, records volume.Listing, p *heal.Policy) []planRep {
	outs, reconnects, owned := companion.Plan(h, ls.subs, records, p)
	learned := map[string]bool{}
	for _, s := range ls.subs {
		learned[s.NQN] = true
	}
	for _, n := range owned {
		learned[n] = false
	}
	var rest []heal.Defect
	for _, d := range defects {
		if !learned[teardownNQN(h, d)] {
			rest = append(rest, d)
		}
	}
	plan := append(planOf(p.Plan(rest)), planOf(outs)...)
	for _, rc := range reconnects {
		plan = append(plan, planRep{Kind: kindReconnect, Scope: heal.ScopeController, Key: rc.NQN + " " + rc.Endpoint, Verdict: heal.Observed,
			Reason: fmt.Sprintf("companion mode would reconnect it with the learned options when it answers (%s)", rc.Why)})
	}
	return plan
}

// teardownNQN is the subsystem whose controllers d tears down.
func teardownNQN(h *nvme.Host, d heal.Defect) string {
	for _, p := range d.Teardown {
		if c, ok := h.Controller(nvme.ControllerName(p.Name)); ok {
			return c.SubsysNQN
		}
	}
	return ""
}

// writeLearned prints the learned endpoints and unreadable learned files.
func (r *report) writeLearned(w io.Writer) {
	if len(r.Learned) > 0 {
		fmt.Fprintln(w, "Learned NVMe endpoints (companion mode, docs/companion.md):")
		rows := [][]string{{"NQN", "ENDPOINT", "CONTROLLER", "LAST STATE", "STATUS", "OPTIONS"}}
		for _, l := range r.Learned {
			rows = append(rows, []string{l.NQN, l.Endpoint, dash(string(l.Controller)), string(l.LastState), l.Status, l.Options})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
	if len(r.UnreadableLearned) > 0 {
		fmt.Fprintf(w, "%d learned subsystem file(s) cannot be read; companion mode leaves each subsystem alone until its file is readable or removed:\n", len(r.UnreadableLearned))
		rows := [][]string{{"FILE", "NQN", "ERROR"}}
		for _, u := range r.UnreadableLearned {
			rows = append(rows, []string{u.File, dash(u.Target), u.Error})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
}
