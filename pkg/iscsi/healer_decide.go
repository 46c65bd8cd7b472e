package iscsi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
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
		r.Kick, why = chooseKick(snap, s, recs, complete)
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
	r.Verdict, r.Reason = heal.Repaired, why
}

// kick runs a login or a logout + login for one report.
func (h *SessionHealer) kick(ctx context.Context, r *Report) {
	klog.FromContext(ctx).V(2).Info("Kicking iSCSI session", "session", r.Session.String(), "target", r.Node.Target, "portal", r.Node.Portal.String(), "kick", r.Kick)
	// The cooldown starts whether the kick works or not: a failing kick
	// must not be repeated every tick.
	h.kicked.Mark(r.Node.HealKey())
	start := h.cfg.Now()
	var err error
	loggedOut := false
	if r.Kick == KickRelogin {
		err = h.cfg.Kicker.Logout(ctx, r.Node, r.Session)
		loggedOut = err == nil
	}
	// A refused logout (32: iscsid still reconnecting an adopted session)
	// skips the login: the session is still there.
	if err == nil {
		err = h.cfg.Kicker.Login(ctx, r.Node)
		if errors.Is(err, ErrAuthFailed) || errors.Is(err, ErrLoginFatal) {
			h.rejected[r.Node.key()] = err
		}
	}
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
	h.settle(r, err, start)
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
		r.Verdict, r.Class, r.Err = heal.Failed, heal.ClassKickFailed, err
		r.Reason = string(r.Kick) + " failed; chosen because " + r.Reason
		if r.Owed {
			r.Reason += "; pathmend logs it in again after the cooldown"
		}
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
