package iscsi

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// observe builds this tick's reports and advances the down and in-state
// clocks: one report per kernel session, plus one per portal of a staged
// volume that has no session.
func (h *SessionHealer) observe(ctx context.Context, m *PortalMatcher, snap *Snapshot, recs []volume.Record) []*Report {
	var reports []*Report
	log := klog.FromContext(ctx)
	// Kernel sessions are keyed by SID: a relogin makes a new SID and a
	// new clock, which is right (the new session is new).
	for _, s := range snap.Sessions {
		r := &Report{Session: s.ID, State: s.State, Node: s.Node()}
		r.Volumes = volumesOf(recs, s.TargetName)
		r.InScope = h.cfg.Scope.InScope(len(r.Volumes))
		key := sessionKey(s.ID)
		wasDownFor, wasDown := h.down.Held(key)
		r.DownFor = h.down.Observe(key, !s.State.LoggedIn())
		r.TimeInState = h.inState.Observe(key+"/"+string(s.State), true)
		// Below the threshold nothing is decided and no verdict is
		// logged: the changes of state are, so that what the heal saw
		// between its verdicts can be read from its log.
		switch up := s.State.LoggedIn(); {
		case !up && !wasDown:
			log.V(2).Info("iSCSI session seen out of LOGGED_IN; its down clock starts now", "session", s.ID.String(), "target", s.TargetName,
				"portal", s.PortalString(), "state", s.State, "threshold", h.cfg.Threshold, "inScope", r.InScope)
		case up && wasDown:
			log.V(2).Info("iSCSI session LOGGED_IN again", "session", s.ID.String(), "target", s.TargetName,
				"portal", s.PortalString(), "downFor", heal.RoundDuration(wasDownFor))
		}
		reports = append(reports, r)
	}
	// A portal of a staged volume with no session at all is down too; its
	// clock is keyed by node record, since it has no SID. Two volumes on
	// one portal make one report.
	absent := map[string]*Report{}
	staged := stagedOnly(recs)
	for _, rec := range staged {
		v := rec.Context.ISCSI
		for _, ep := range v.Portals {
			if hasSessionTo(m, snap, v.IQN, ep) {
				continue
			}
			n := Node{Target: v.IQN, Portal: ep, Iface: h.cfg.Iface}
			if r, err := ResolveEndpoint(ctx, h.cfg.Resolver, ep); err == nil {
				n.Portal = r
			}
			if absent[n.key()] != nil {
				continue
			}
			r := &Report{Node: n, State: SessionAbsent, InScope: h.cfg.Scope != HealForeign, Volumes: volumesOf(staged, v.IQN)}
			h.observeAbsent(r)
			absent[n.key()] = r
			reports = append(reports, r)
		}
	}
	return append(reports, h.observeOwed(m, snap, staged, absent)...)
}

// observeAbsent advances the clocks of a report without a session; they
// are keyed by node record.
func (h *SessionHealer) observeAbsent(r *Report) {
	key := "node:" + r.Node.key()
	r.DownFor = h.down.Observe(key, true)
	r.TimeInState = h.inState.Observe(key, true)
}

// observeOwed settles the node records a kick logged out: one back in
// LOGGED_IN is paid; one of a target whose staged volumes were all
// unstaged since is void (their detach owns the sessions). Every other is
// reported absent — in scope whatever the heal scope, since pathmend took
// the session away — and down since its kick began. absent holds this
// tick's absent reports of staged portals by node key; an owed record
// among them is marked, not reported twice. staged are the records in
// state staged: a detaching volume's detach owns its sessions.
func (h *SessionHealer) observeOwed(m *PortalMatcher, snap *Snapshot, staged []volume.Record, absent map[string]*Report) []*Report {
	var out []*Report
	for key, o := range h.owed {
		found, up := sessionTo(m, snap, o.node.Target, o.node.Portal)
		switch {
		case up, o.staged && len(volumesOf(staged, o.node.Target)) == 0:
			delete(h.owed, key)
			continue
		case found:
			continue // a session again: reported and judged as one
		}
		r := absent[key]
		if r == nil {
			r = &Report{Node: o.node, State: SessionAbsent, Volumes: volumesOf(staged, o.node.Target)}
			h.observeAbsent(r)
			out = append(out, r)
		}
		r.InScope, r.Owed = true, true
		r.DownFor = h.cfg.Now().Sub(o.since)
	}
	return out
}

func hasSessionTo(m *PortalMatcher, snap *Snapshot, iqn string, ep volume.Endpoint) bool {
	found, _ := sessionTo(m, snap, iqn, ep)
	return found
}

// sessionTo reports whether target iqn has a session to portal ep, and
// whether one of them is LOGGED_IN.
func sessionTo(m *PortalMatcher, snap *Snapshot, iqn string, ep volume.Endpoint) (found, loggedIn bool) {
	for _, s := range snap.SessionsOf(iqn) {
		if m.Session(s, iqn, ep) {
			found = true
			loggedIn = loggedIn || s.State.LoggedIn()
		}
	}
	return found, loggedIn
}

// probe checks the portal of every down, in-scope report (each portal
// once, ProbeConcurrency at a time) and advances the reachable clocks.
// A portal not probed this tick loses its streak at the sweep: the
// reachable time only counts while its session is down.
func (h *SessionHealer) probe(ctx context.Context, reports []*Report) {
	byPortal := map[string][]*Report{}
	var portals []volume.Endpoint
	for _, r := range reports {
		if r.State.LoggedIn() || !r.InScope || r.Node.Portal.Host == "" {
			continue
		}
		p := r.Node.Portal.String()
		if _, ok := byPortal[p]; !ok {
			portals = append(portals, r.Node.Portal)
		}
		byPortal[p] = append(byPortal[p], r)
	}
	// Probes run in parallel: a dead portal costs its full timeout, and a
	// tick must not take that per portal. With ProbeConcurrency 1 they run
	// in order on the tick's goroutine (a deterministic scheduler).
	results := make([]Reachability, len(portals))
	if h.cfg.ProbeConcurrency == 1 {
		for i, p := range portals {
			results[i] = h.cfg.Prober.Probe(ctx, p)
		}
	} else {
		sem := make(chan struct{}, h.cfg.ProbeConcurrency)
		var wg sync.WaitGroup
		for i, p := range portals {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				results[i] = h.cfg.Prober.Probe(ctx, p)
			}()
		}
		wg.Wait()
	}
	for i, p := range portals {
		res := results[i]
		held := h.reach.Observe("portal:"+p.String(), res.Reachable())
		for _, r := range byPortal[p.String()] {
			r.Probe = &res
			r.ReachableFor = held
		}
	}
}

// resolvePending closes the kicks of earlier ticks: a node record back in
// LOGGED_IN makes its kick Repaired (with the time it took); a kick older
// than the verify window without that makes it Failed. Either way the
// final verdict line is logged now.
func (h *SessionHealer) resolvePending(reports []*Report) {
	now := h.cfg.Now()
	// Kicks are matched by node record, not SID: a relogin brings the
	// record back under a new session.
	up := map[string]*Report{}
	for _, r := range reports {
		if r.State.LoggedIn() {
			up[r.Node.key()] = r
			delete(h.rejected, r.Node.key())
		}
	}
	for key, p := range h.pending {
		final := p.report
		if r, ok := up[key]; ok {
			final.Verdict, final.Class, final.NewSession, final.TimeToLoggedIn = heal.Repaired, heal.ClassLoggedIn, r.Session, now.Sub(p.at)
			final.Reason = fmt.Sprintf("LOGGED_IN %s after %s", heal.RoundDuration(final.TimeToLoggedIn), final.Kick)
			r.Verdict, r.Kick, r.Reason, r.Class = final.Verdict, final.Kick, final.Reason, final.Class
			r.NewSession, r.TimeToLoggedIn = final.NewSession, final.TimeToLoggedIn
			h.gate.Forget(key)
		} else if age := now.Sub(p.at); age >= h.cfg.VerifyWindow {
			final.Verdict, final.Class = heal.Failed, heal.ClassNotLoggedIn
			final.Reason = fmt.Sprintf("not LOGGED_IN %s after %s", heal.RoundDuration(age), final.Kick)
			final.Err = fmt.Errorf("%s did not bring %s back within %s", final.Kick, p.report.Node, h.cfg.VerifyWindow)
			// A relogin logged the session out: without a session iscsid
			// retries nothing, so the heal keeps logging it in.
			if final.Kick == KickRelogin || final.Owed {
				h.owe(&final, p.at)
			}
			for _, r := range reports {
				if r.Node.key() == key {
					r.Verdict, r.Kick, r.Reason, r.Class, r.Err = final.Verdict, final.Kick, final.Reason, final.Class, final.Err
				}
			}
		} else {
			continue
		}
		delete(h.pending, key)
		h.logVerdict(final)
	}
}
