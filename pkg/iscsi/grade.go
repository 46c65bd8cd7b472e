package iscsi

import (
	"fmt"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Reasons of the conditions Grade reports.
const (
	ReasonPathsBelowExpected = "PathsBelowExpected"
	ReasonNoLivePath         = "NoLivePath"
)

// SessionClocks tells how long the observer has seen a session out of
// LOGGED_IN. *SessionHealer implements it; Grade uses it for its message.
type SessionClocks interface {
	DownFor(id SessionID) (time.Duration, bool)
}

// PortalPath is how one portal of a volume looks in a snapshot.
type PortalPath struct {
	Portal volume.Endpoint
	// Session is the session that serves it (the live one when one is,
	// else the last one looked at); 0 when none does.
	Session SessionID
	// Live: a LOGGED_IN session whose LUN has a running disk.
	Live bool
	// Problems say why it is not live, one per session ("session5
	// (127.0.0.2:3260) FAILED for 40s"), or "no session to …".
	Problems []string
}

// Grade grades the paths of volume v in snap: Healthy when every portal
// of the volume has a LOGGED_IN session whose LUN is running, Degraded
// when some do, Inaccessible when none do. The message names each portal
// that is not live and why, e.g. "1 of 2 portals logged in; session5
// (127.0.0.2:3260) FAILED for 40s" (clocks, when set, say for how long).
// It reads only its arguments.
func Grade(m *PortalMatcher, snap *Snapshot, v *volume.ISCSI, clocks SessionClocks) (volume.Condition, []PortalPath) {
	live := 0
	var problems []string
	paths := make([]PortalPath, 0, len(v.Portals))
	// A portal counts once, live when any of its sessions is a live path;
	// its problems are listed only when none is.
	for _, ep := range v.Portals {
		p := PortalPath{Portal: ep}
		for _, s := range snap.SessionsOf(v.IQN) {
			if !m.Session(s, v.IQN, ep) {
				continue
			}
			p.Session = s.ID
			pr := pathProblem(s, v.LUN, clocks)
			if pr == "" {
				p.Live, p.Problems = true, nil
				break
			}
			p.Problems = append(p.Problems, pr)
		}
		switch {
		case p.Live:
			live++
		case len(p.Problems) == 0:
			p.Problems = []string{"no session to " + ep.String()}
			problems = append(problems, p.Problems...)
		default:
			problems = append(problems, p.Problems...)
		}
		paths = append(paths, p)
	}
	msg := fmt.Sprintf("%d of %d portals logged in", live, len(v.Portals))
	if len(problems) > 0 {
		msg += "; " + strings.Join(problems, "; ")
	}
	switch {
	case live == len(v.Portals):
		return volume.Condition{Status: volume.Healthy, Message: msg}, paths
	case live > 0:
		return volume.Condition{Status: volume.Degraded, Reason: ReasonPathsBelowExpected, Message: msg}, paths
	}
	return volume.Condition{Status: volume.Inaccessible, Reason: ReasonNoLivePath, Message: msg}, paths
}

// pathProblem says why session s is not a live path to LUN lun; "" when
// it is one.
func pathProblem(s Session, lun int, clocks SessionClocks) string {
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
