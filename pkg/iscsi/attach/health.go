package attach

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Reasons of the conditions Health reports.
const (
	ReasonPathsBelowExpected = "PathsBelowExpected"
	ReasonNoLivePath         = "NoLivePath"
	ReasonUnreadable         = "StateUnreadable"
)

// Health reads sysfs once and grades the volume's paths: volume.Healthy when
// every portal of the volume has a LOGGED_IN session whose LUN is
// running, volume.Degraded when some do, volume.Inaccessible when none do. The message
// names each portal that is not live and why, e.g. "1 of 2 portals
// logged in; session5 (127.0.0.2:3260) FAILED for 40s". It never repairs.
func (a *Attacher) Health(ctx context.Context, rec volume.Record) volume.Condition {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonUnreadable, Message: err.Error()}
	}
	snap, err := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonUnreadable, Message: err.Error()}
	}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	c := grade(m, snap, v, a.cfg.Clocks)
	c.Devices = iscsi.CurrentDevices(a.cfg.Sys, snap, m, v)
	return c
}

// grade computes the condition of volume v in snap.
func grade(m *iscsi.PortalMatcher, snap *iscsi.Snapshot, v *volume.ISCSI, clocks SessionClocks) volume.Condition {
	live := 0
	var problems []string
	// A portal counts once, live when any of its sessions is a live path;
	// its problems are listed only when none is.
	for _, ep := range v.Portals {
		var mine []string
		ok := false
		for _, s := range snap.SessionsOf(v.IQN) {
			if !m.Session(s, v.IQN, ep) {
				continue
			}
			p := pathProblem(s, v.LUN, clocks)
			if p == "" {
				ok = true
				break
			}
			mine = append(mine, p)
		}
		switch {
		case ok:
			live++
		case len(mine) == 0:
			problems = append(problems, "no session to "+ep.String())
		default:
			problems = append(problems, mine...)
		}
	}
	msg := fmt.Sprintf("%d of %d portals logged in", live, len(v.Portals))
	if len(problems) > 0 {
		msg += "; " + strings.Join(problems, "; ")
	}
	switch {
	case live == len(v.Portals):
		return volume.Condition{Status: volume.Healthy, Message: msg}
	case live > 0:
		return volume.Condition{Status: volume.Degraded, Reason: ReasonPathsBelowExpected, Message: msg}
	}
	return volume.Condition{Status: volume.Inaccessible, Reason: ReasonNoLivePath, Message: msg}
}

// pathProblem says why session s is not a live path to LUN lun; "" when
// it is one.
func pathProblem(s iscsi.Session, lun int, clocks SessionClocks) string {
	who := fmt.Sprintf("%s (%s)", s.ID, s.PortalString())
	if !s.State.LoggedIn() {
		if clocks != nil {
			if d, ok := clocks.DownFor(s.ID); ok {
				return fmt.Sprintf("%s %s for %s", who, s.State, roundDuration(d))
			}
		}
		return fmt.Sprintf("%s %s", who, s.State)
	}
	l, ok := s.LUN(lun)
	switch {
	case !ok:
		return fmt.Sprintf("%s LOGGED_IN without LUN %d", who, lun)
	case l.Disk == "":
		return fmt.Sprintf("%s LUN %d has no disk", who, lun)
	case !l.Running():
		return fmt.Sprintf("%s LUN %d (%s) %s", who, lun, l.Disk, l.State)
	}
	return ""
}

// roundDuration keeps messages readable: whole seconds, or ms below one.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
