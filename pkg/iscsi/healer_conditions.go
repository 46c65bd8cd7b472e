package iscsi

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Reasons of the node conditions NodeConditions reports.
const (
	// ReasonTargetUnreachable: no portal of a target answers.
	ReasonTargetUnreachable = "TargetUnreachable"
	// ReasonPortalsUnreachable: some portals of a target do not answer.
	ReasonPortalsUnreachable = "PortalsUnreachable"
	// ReasonSessionStuck: a session is down and the heal cannot kick it
	// (the target rejects the login, it is out of the heal's scope, the
	// iscsid restart budget is spent, or a login pathmend owes it keeps
	// failing).
	ReasonSessionStuck = "ISCSISessionStuck"
)

// NodeConditions turns one tick's reports into the node's iSCSI storage
// conditions: per target whose portals did not answer the heal's probe,
// TargetUnreachable (Inaccessible) when none of the target's portals the
// tick looked at answers or is logged in, else PortalsUnreachable
// (Degraded); and one ISCSISessionStuck (Degraded) per session the heal
// cannot kick, with what an operator can do about it.
func NodeConditions(reports []Report) []volume.Condition {
	type target struct{ portals, down map[string]bool }
	targets := map[string]*target{}
	var stuck []string
	for _, r := range reports {
		t := targets[r.Node.Target]
		if t == nil {
			t = &target{portals: map[string]bool{}, down: map[string]bool{}}
			targets[r.Node.Target] = t
		}
		p := r.Node.Portal.String()
		t.portals[p] = true
		if r.Probe != nil && !r.Probe.Reachable() {
			t.down[p+" "+r.Probe.TCPString()] = true
		}
		if s := stuckSession(r); s != "" {
			stuck = append(stuck, s)
		}
	}
	var out []volume.Condition
	for _, iqn := range slices.Sorted(maps.Keys(targets)) {
		t := targets[iqn]
		if len(t.down) == 0 {
			continue
		}
		down := slices.Sorted(maps.Keys(t.down))
		c := volume.Condition{Status: volume.Degraded, Reason: ReasonPortalsUnreachable}
		if len(down) >= len(t.portals) {
			c.Status, c.Reason = volume.Inaccessible, ReasonTargetUnreachable
		}
		c.Message = fmt.Sprintf("iSCSI target %s: %d of %d portals do not answer from this node: %s; check the target's portals and the network between this node and them",
			iqn, len(down), len(t.portals), strings.Join(down, "; "))
		out = append(out, c)
	}
	if len(stuck) > 0 {
		slices.Sort(stuck)
		out = append(out, volume.Condition{Status: volume.Degraded, Reason: ReasonSessionStuck, Message: strings.Join(stuck, "; ")})
	}
	return out
}

// stuckSession describes a down session the heal cannot kick, and what to
// do; "" for any other report.
func stuckSession(r Report) string {
	if r.State.LoggedIn() {
		return ""
	}
	what := fmt.Sprintf("%s to %s at %s (%s for %s)", r.sessionLabel(), r.Node.Target, r.Node.Portal, r.State, heal.RoundDuration(r.DownFor))
	switch {
	case r.Verdict == heal.Refused && r.Class == heal.ClassLoginRejected:
		return what + ": the target rejects the login: fix its CHAP credentials or ACL for this node's initiator name; pathmend does not retry a rejected login"
	case r.Verdict == heal.Refused && r.Class == heal.ClassOutOfScope:
		return what + ": no staged volume uses the target, so pathmend does not kick it: log it in or out by hand, or run pathmend with --heal-iscsi-scope=all"
	case r.Verdict == heal.Deferred && r.Class == heal.ClassRestartCooldown:
		return what + ": it is the last path of a device in use and iscsid was restarted recently; pathmend restarts iscsid at most once per --iscsid-restart-cooldown: restart iscsid by hand if the volume cannot wait"
	case r.Owed && r.Verdict == heal.Failed:
		return what + ": pathmend logged the session out and its login failed (" + r.Reason + "); it logs in again once per --heal-cooldown: check the target"
	}
	return ""
}

// sessionLabel names the session, or "no session" for an absent one.
func (r Report) sessionLabel() string {
	if r.State == SessionAbsent {
		return "no session"
	}
	return r.Session.String()
}
