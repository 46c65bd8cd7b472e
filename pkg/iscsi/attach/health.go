package attach

import (
	"context"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Reasons of the conditions Health reports: iscsi.Grade's, and a state
// that could not be read.
const (
	ReasonPathsBelowExpected = iscsi.ReasonPathsBelowExpected
	ReasonNoLivePath         = iscsi.ReasonNoLivePath
	ReasonUnreadable         = "StateUnreadable"
)

// Health reads sysfs once and grades the volume's paths: volume.Healthy when
// every portal of the volume has a LOGGED_IN session whose LUN is
// running, volume.Degraded when some do, volume.Inaccessible when none do. The message
// names each portal that is not live and why, e.g. "1 of 2 portals
// logged in; session5 (127.0.0.2:3260) FAILED for 40s". It reads the
// volume's own target only (its sessions, their LUNs and maps:
// iscsi.Reader.ReadTarget), whatever the number of sessions on the node,
// and never repairs.
func (a *Attacher) Health(ctx context.Context, rec volume.Record) volume.Condition {
	v, err := iscsiContext(rec.Context)
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonUnreadable, Message: err.Error()}
	}
	snap, err := a.health.ReadTarget(v.IQN, a.cfg.Clock.Now())
	if err != nil {
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonUnreadable, Message: err.Error()}
	}
	m := iscsi.NewPortalMatcher(ctx, a.cfg.Resolver)
	c, _ := iscsi.Grade(m, snap, v, a.cfg.Clocks)
	c.Devices = iscsi.CurrentDevices(a.cfg.Sys, snap, m, v)
	return c
}
