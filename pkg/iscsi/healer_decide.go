package iscsi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// decide judges every down report and, in repair mode, acts: logins and
// relogins first (narrowest), then at most one iscsid restart for all
// sessions that need one, and only in a tick where nothing else was
// kicked (the next tick decides on fresh state).
func (h *SessionHealer) decide(ctx context.Context, snap *Snapshot, recs []volume.Record, complete bool, reports []*Report) {
	var restarts []*Report
	kickedNow := false
	for _, r := range reports {
		if r.State.LoggedIn() || r.Verdict != "" {
			continue // up, or its pending kick was resolved this tick
		}
		h.judge(snap, recs, complete, r)
		switch {
		case r.Verdict != heal.Repaired:
			h.logVerdict(*r)
		case r.Kick == KickRestart:
			restarts = append(restarts, r)
		default:
			h.kick(ctx, r)
			kickedNow = true
		}
	}
	if len(restarts) == 0 {
		return
	}
	if kickedNow {
		for _, r := range restarts {
			r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassNarrowestFirst, "narrowest first: another kick ran this tick; restart decided on fresh state next tick"
			h.logVerdict(*r)
		}
		return
	}
	h.restartDaemon(ctx, restarts)
}

// judge walks the ladder for one down report and sets Verdict, Kick and
// Reason. Verdict Repaired means "allowed now" (not yet run); an empty
// Verdict means there is nothing to decide yet.
func (h *SessionHealer) judge(snap *Snapshot, recs []volume.Record, complete bool, r *Report) {
	key, th := r.Node.key(), h.cfg.Threshold
	// Below the threshold iscsid is presumed to be recovering the session:
	// there is nothing to decide, and nothing is logged.
	// A node record pathmend logged out has no session for iscsid to
	// recover: it is logged in again without the wait.
	if r.DownFor < th && !r.Owed {
		r.Reason = fmt.Sprintf("down %s; iscsid has %s to recover it by itself", heal.RoundDuration(r.DownFor), th)
		return
	}
	// A kick already ran: wait for its outcome instead of stacking another.
	if p, ok := h.pending[key]; ok {
		r.Kick = p.report.Kick
		r.Reason = fmt.Sprintf("awaiting LOGGED_IN after %s %s ago", r.Kick, heal.RoundDuration(h.cfg.Now().Sub(p.at)))
		return
	}
	if !r.InScope && h.cfg.Scope == HealForeign {
		r.Verdict, r.Class, r.Reason = heal.Refused, heal.ClassOwnedByNodePlugin, fmt.Sprintf("owned by the node plugin: staged volume(s) %s use target %s", strings.Join(r.Volumes, ","), r.Node.Target)
		return
	}
	if !r.InScope {
		r.Verdict, r.Class, r.Reason = heal.Refused, heal.ClassOutOfScope, fmt.Sprintf("out of scope: no staged volume uses target %s (heal scope %s)", r.Node.Target, h.cfg.Scope)
		return
	}
	// (c) The target refused our own login: kicking again cannot fix
	// credentials or ACLs, and would hammer the target.
	if err := h.rejected[key]; err != nil {
		r.Verdict, r.Class, r.Reason = heal.Refused, heal.ClassLoginRejected, "login rejected by the target: "+err.Error()
		return
	}
	// iscsid retries an unreachable portal forever by itself; no kick can
	// reach a target the network cannot.
	if r.Probe == nil || !r.Probe.Reachable() {
		why := "not probed"
		if r.Probe != nil {
			why = r.Probe.TCPString()
		}
		// Without a session iscsid has nothing to retry: the login waits
		// for the portal, and is pathmend's to make.
		if r.State == SessionAbsent {
			r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassAwaitingPortal, "portal unreachable: "+why+"; no session for iscsid to retry: pathmend logs in once the portal answers"
			return
		}
		r.Verdict, r.Class, r.Reason = heal.Refused, heal.ClassPortalUnreachable, "portal unreachable: "+why+"; iscsid retries by itself"
		return
	}
	if r.ReachableFor < th && !r.Owed {
		r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassReachability, fmt.Sprintf("reachability: portal reachable for %s of the %s required without interruption", heal.RoundDuration(r.ReachableFor), th)
		return
	}
	// The ladder, narrowest first: log in an absent session; log out and in
	// a session whose LUNs lose nothing by it; else restart iscsid.
	why := "no session to the portal of a staged volume"
	if r.Owed {
		why = fmt.Sprintf("pathmend logged the session out %s ago and it is not back", heal.RoundDuration(r.DownFor))
	}
	r.Kick = KickLogin
	if r.State != SessionAbsent {
		s, _ := snap.Session(r.Session)
		r.Kick, why = chooseKick(snap, s, recs, complete, h.cfg.Use)
	}
	// A restart bounces every session of the node: its budget is per node.
	// Logins and relogins touch one node record: their cooldown is per
	// record.
	if r.Kick == KickRestart {
		if left, ago := h.restart.Left(restartKey); left > 0 {
			r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassRestartCooldown, fmt.Sprintf("restart cooldown: iscsid restarted %s ago, %s left; %s", heal.RoundDuration(ago), heal.RoundDuration(left), why)
			return
		}
	} else if left, ago := h.kicked.Left(r.Node.HealKey()); left > 0 {
		r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassCooldown, fmt.Sprintf("cooldown: kicked %s ago, %s left", heal.RoundDuration(ago), heal.RoundDuration(left))
		return
	}
	if h.cfg.Mode == heal.ModeObserve {
		r.Verdict, r.Class, r.Reason = heal.Observed, heal.ClassObserveMode, "observe mode: would "+string(r.Kick)+"; "+why
		return
	}
	if flag, off := h.cfg.Disabled[r.Kick]; off {
		r.Verdict, r.Class, r.Reason = heal.Observed, heal.ClassActionDisabled, "would "+string(r.Kick)+" but it is not enabled ("+flag+"); "+why
		return
	}
	r.Verdict, r.Reason = heal.Repaired, why
}

// kick plans a login or a logout + login of one report for its target's
// job (Kick); Settle starts its cooldown and its clock, or defers it when
// the target is busy.
func (h *SessionHealer) kick(_ context.Context, r *Report) {
	h.planned[r.Node.Target] = append(h.planned[r.Node.Target], *r)
}

// runKick logs out (a relogin) and logs in one node record. loggedOut
// reports whether the logout ran: the session is then gone, and iscsid
// will not bring it back.
func (h *SessionHealer) runKick(ctx context.Context, r Report) (loggedOut bool, err error) {
	if r.Kick == KickRelogin {
		err = h.cfg.Kicker.Logout(ctx, r.Node, r.Session)
		loggedOut = err == nil
	}
	// A refused logout (32: iscsid still reconnecting an adopted session)
	// skips the login: the session is still there.
	if err == nil {
		err = h.cfg.Kicker.Login(ctx, r.Node)
	}
	return loggedOut, err
}

// noteRejection remembers a login the target rejected: kicking again
// cannot fix credentials or ACLs.
func (h *SessionHealer) noteRejection(n Node, err error) {
	if errors.Is(err, ErrAuthFailed) || errors.Is(err, ErrLoginFatal) {
		h.rejected[n.key()] = err
	}
}

// noteDebt records what a kick of r begun at start left owed: a kick
// that logged the session out, or an owed login, that failed leaves the
// node record without a session until a login works; an owed login whose
// node record was deleted is owed no more.
func (h *SessionHealer) noteDebt(r *Report, loggedOut bool, err error, start time.Time) {
	switch {
	case err == nil:
	case r.Owed && errors.Is(err, ErrNoObjects):
		// The node record was deleted: nobody wants this session back.
		delete(h.owed, r.Node.key())
	case loggedOut || r.Owed:
		// The session is gone and iscsid will not bring it back: the
		// node is worse off than before the kick until a login works.
		h.owe(r, start)
	}
}

// owe records that the kick of r, begun at start, left its node record
// without a session; an earlier debt keeps its time.
func (h *SessionHealer) owe(r *Report, start time.Time) {
	key := r.Node.key()
	if o, ok := h.owed[key]; ok {
		o.staged = o.staged || len(r.Volumes) > 0
		h.owed[key] = o
		return
	}
	h.owed[key] = owed{node: r.Node, since: start, staged: len(r.Volumes) > 0}
}

// kickResult is the outcome of a kick run as a target job.
type kickResult struct {
	key  string
	node Node
	err  error
	// loggedOut is set when the kick's logout ran.
	loggedOut bool
	// skipped says why the job did not kick: under the lease no staged
	// volume wanted the session any more.
	skipped string
}

// stillWanted re-reads the target's records under its lease: a login of
// an absent portal is wanted only while a staged volume lists it, a
// relogin only while some volume of the target is not detaching (or, in
// scope all, while the target has no record at all); a login pathmend
// owes (it logged the session out) of a target with no record at all is
// wanted too. It returns why the kick is no longer wanted, "" when it is.
func stillWanted(ctx context.Context, res Resolver, scope HealScope, lease *intent.Lease, r Report) string {
	ls, err := lease.Listing()
	if err != nil {
		return "cannot read the target's records: " + err.Error()
	}
	if scope == HealForeign {
		if len(ls.Records) > 0 || len(ls.Unreadable) > 0 {
			return "a staged-volume record of the node plugin names " + r.Node.Target + " now: its sessions are the plugin's"
		}
		return ""
	}
	if (r.State != SessionAbsent || r.Owed) && len(ls.Records) == 0 && len(r.Volumes) == 0 {
		return "" // a session of a target pathmend did not stage (scope all), or owed
	}
	m := NewPortalMatcher(ctx, res)
	for _, rec := range ls.Records {
		v := rec.Context.ISCSI
		if v == nil || rec.State == volume.StateDetaching {
			continue
		}
		if r.State != SessionAbsent && rec.State == volume.StateStaged {
			return ""
		}
		for _, p := range v.Portals {
			if rec.State == volume.StateStaged && m.Match(p, r.Node.Portal.Host, int(r.Node.Portal.Port)) {
				return ""
			}
		}
	}
	return "no staged volume of " + r.Node.Target + " wants the session any more (detaching or unstaged)"
}

// readResults settles the kicks whose jobs ended: an error is a Failed
// verdict (and, when the kick left the node record without a session, a
// login owed), a skipped kick a Refused one; a kick that ran awaits
// LOGGED_IN (resolvePending). The reports of the kick's node record carry
// the verdict.
func (h *SessionHealer) readResults(reports []*Report) {
	h.resMu.Lock()
	results := h.results
	h.results = nil
	h.resMu.Unlock()
	for _, res := range results {
		p, ok := h.pending[res.key]
		if !ok {
			continue
		}
		h.noteRejection(res.node, res.err)
		final := p.report
		switch {
		case res.skipped != "":
			final.Verdict, final.Class, final.Reason = heal.Refused, heal.ClassNotWanted, "not kicked: "+res.skipped
		case res.err != nil:
			h.noteDebt(&final, res.loggedOut, res.err, p.at)
			h.failed(&final, res.err)
		default:
			continue // ran: awaiting LOGGED_IN
		}
		delete(h.pending, res.key)
		for _, r := range reports {
			if r.Node.key() == res.key {
				r.Verdict, r.Class, r.Kick, r.Reason, r.Err = final.Verdict, final.Class, final.Kick, final.Reason, final.Err
			}
		}
		h.logVerdict(final)
	}
}

// failed makes r the Failed verdict of its kick's error.
func (h *SessionHealer) failed(r *Report, err error) {
	r.Verdict, r.Class, r.Err = heal.Failed, heal.ClassKickFailed, err
	r.Reason = string(r.Kick) + " failed; chosen because " + r.Reason
	if _, owed := h.owed[r.Node.key()]; owed && r.Kick != KickRestart {
		r.Reason += "; pathmend logs it in again after the cooldown"
	}
}

// restartDaemon restarts iscsid once for every report that needs it.
func (h *SessionHealer) restartDaemon(ctx context.Context, rs []*Report) {
	klog.FromContext(ctx).V(2).Info("Restarting iscsid for stuck sessions", "sessions", len(rs))
	start := h.cfg.Now()
	err := h.cfg.Kicker.RestartDaemon(ctx)
	// Refused before running: the budget is not spent, the next tick
	// decides again.
	if errors.Is(err, ErrInFlight) {
		for _, r := range rs {
			r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassInFlight, "in flight: a login or logout is running; iscsid is not restarted under it"
			h.logVerdict(*r)
		}
		return
	}
	h.restart.Mark(restartKey)
	if h.cfg.Stamps != nil {
		if err := h.cfg.Stamps.SetStamp(restartStamp, h.cfg.Now()); err != nil {
			klog.FromContext(ctx).Error(err, "Could not record the iscsid restart; a restarted pathmend would not know its restart budget is spent")
		}
	}
	for _, r := range rs {
		h.settle(r, err, start)
	}
}

// settle records the outcome of a kick begun at start: an error is a
// Failed verdict, logged now; success leaves the kick pending until the
// session is seen LOGGED_IN (or the verify window passes), its time
// counted from start.
func (h *SessionHealer) settle(r *Report, err error, start time.Time) {
	if err != nil {
		h.failed(r, err)
		h.logVerdict(*r)
		return
	}
	r.Verdict = heal.Kicked
	h.pending[r.Node.key()] = pending{at: start, report: *r}
}

// logVerdict writes the one level-0 line of a verdict. Refusals,
// deferrals and observations are logged when they change (and again
// after the relog interval); repairs and failures always.
func (h *SessionHealer) logVerdict(r Report) {
	switch r.Verdict {
	case heal.Refused, heal.Deferred, heal.Observed:
		what := string(r.Verdict) + ":" + string(r.Kick) + ":" + string(r.Class)
		if !h.gate.Should(r.Node.key(), what) {
			return
		}
	case heal.Repaired, heal.Failed:
	default:
		return
	}
	tcp, icmp := "not probed", ICMPSkipped
	if r.Probe != nil {
		tcp, icmp = r.Probe.TCPString(), r.Probe.ICMP
	}
	kv := []any{
		"verdict", r.Verdict, "session", r.sessionName(), "target", r.Node.Target,
		"portal", r.Node.Portal.String(), "state", r.State,
		"timeInState", heal.RoundDuration(r.TimeInState), "downFor", heal.RoundDuration(r.DownFor),
		"tcp", tcp, "icmp", icmp, "reachableFor", heal.RoundDuration(r.ReachableFor),
		"kick", r.Kick, "reason", r.Reason, "volumes", strings.Join(r.Volumes, ","), "mode", h.cfg.Mode,
	}
	switch r.Verdict {
	case heal.Repaired:
		kv = append(kv, "result", "LOGGED_IN", "newSession", r.NewSession.String(), "timeToLoggedIn", heal.RoundDuration(r.TimeToLoggedIn))
	case heal.Failed:
		kv = append(kv, "result", "failed")
	default:
		kv = append(kv, "result", "not kicked")
	}
	if r.Err != nil {
		klog.ErrorS(r.Err, "iSCSI session verdict", kv...)
		return
	}
	klog.InfoS("iSCSI session verdict", kv...)
}

// sessionName is the session's sysfs name, "" for an absent session.
func (r Report) sessionName() string {
	if r.State == SessionAbsent {
		return ""
	}
	return r.Session.String()
}
