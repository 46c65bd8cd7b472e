package iscsiheal

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Holder is the holder of an iSCSI job's lease, as a busy RPC is told.
const Holder = "iSCSI session heal"

// Deps are the transport's seams.
type Deps struct {
	SysFS sysfs.FS
	// Healer is the process's session heal; its scope says which sessions
	// it may kick.
	Healer *iscsi.SessionHealer
	// Metrics, when set, counts the kicks whose outcome is known
	// (pathmend_iscsi_session_recoveries_total).
	Metrics *metrics.Metrics
	// Resolver resolves host names in volume portals; net.DefaultResolver
	// when nil.
	Resolver iscsi.Resolver
	Clock    clock.PassiveClock
}

// Transport is the iSCSI transport as the loop drives it: each tick it
// reads sysfs once through the Reader it keeps, writes what it read of
// the staged iSCSI volumes, and has the session heal decide (Plan); the
// heal's logins and relogins of one target run as that target's job, with
// its lease (Job); Finish reads what became of them. Plan and Finish are
// called by one loop, one tick at a time.
type Transport struct {
	deps   Deps
	reader *iscsi.Reader

	// snap and recs are the tick between Plan and Finish; skip is set
	// when the heal did not run this tick.
	snap *iscsi.Snapshot
	recs []volume.Record
	skip bool
}

// New validates deps.
func New(deps Deps) (*Transport, error) {
	if deps.Healer == nil || deps.SysFS.Root() == "" {
		return nil, errors.New("iscsi transport: sysfs and the session heal are required")
	}
	if deps.Resolver == nil {
		deps.Resolver = net.DefaultResolver
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	return &Transport{deps: deps, reader: iscsi.NewReader(deps.SysFS)}, nil
}

// Name is the transport the loop routes iSCSI targets to.
func (t *Transport) Name() volume.Transport { return volume.TransportISCSI }

// Reader is the reader the transport keeps.
func (t *Transport) Reader() *iscsi.Reader { return t.reader }

func iscsiTarget(iqn string) volume.Target {
	return volume.Target{Transport: volume.TransportISCSI, Name: iqn}
}

// Plan reads the iSCSI state once and has the session heal decide on it:
// the targets whose logins or relogins it allows get a job. In the
// foreign scope alone (companion mode) the heal is skipped while a record
// cannot be read: any session may be the node plugin's.
func (t *Transport) Plan(ctx context.Context, r model.Round) model.Plan {
	t.snap, t.recs, t.skip = nil, r.Listing.Records, false
	var p model.Plan
	snap, err := t.reader.Read(t.deps.Clock.Now())
	if err != nil {
		klog.ErrorS(err, "Read iSCSI state failed; skipping the session heal this tick")
		t.skip = true
		return p
	}
	t.snap = snap
	recErr := r.Listing.Err()
	if r.ListErr != nil {
		recErr = r.ListErr
	}
	if !r.Owned && recErr != nil {
		klog.ErrorS(recErr, "Staged-volume records could not all be read; the companion's iSCSI pass is skipped this tick")
		t.skip = true
		return p
	}
	for _, iqn := range t.deps.Healer.Plan(ctx, snap, r.Listing.Records, recErr) {
		p.Work = append(p.Work, model.Work{Target: iscsiTarget(iqn), Holder: Holder})
	}
	return p
}

// Job runs the kicks the heal planned for the lease's target.
func (t *Transport) Job(ctx context.Context, lease *intent.Lease) model.Result {
	tg := lease.Target()
	t.deps.Healer.Kick(ctx, tg.Name, lease)
	return model.Result{Target: tg}
}

// Finish reads what became of the tick's kicks and reports the staged
// iSCSI volumes as the tick's read found them, the node's iSCSI
// conditions (portals that do not answer, sessions the heal cannot
// kick), the sessions down (SessionDown) and every decided verdict.
func (t *Transport) Finish(ctx context.Context, r model.Round, jobs model.Jobs) model.Report {
	var rep model.Report
	if t.skip || t.snap == nil {
		return rep
	}
	busy := map[string]string{}
	for tg, holder := range jobs.Busy {
		busy[tg.Name] = holder
	}
	reports := t.deps.Healer.Settle(busy)
	rep.Defects = map[heal.Kind]int{}
	for _, x := range reports {
		// Every session seen down counts, in scope or not, as in
		// `pathmend diagnose`: the heal's scope limits kicks, not reports.
		if x.State != iscsi.SessionLoggedIn && x.DownFor > 0 {
			rep.Defects[iscsi.KindSessionDown]++
		}
		// Nothing decided yet, or a kick awaiting its outcome: no verdict.
		if x.Verdict == "" || x.Verdict == heal.Kicked {
			continue
		}
		rep.Outcomes = append(rep.Outcomes, heal.Outcome{
			Defect:  heal.Defect{Kind: iscsi.KindSessionDown, Scope: heal.ScopeController, Key: x.Node.HealKey()},
			Verdict: x.Verdict, Reason: x.Reason, Class: x.Class, Err: x.Err,
		})
		if t.deps.Metrics != nil {
			switch x.Verdict {
			case heal.Repaired:
				t.deps.Metrics.ObserveSessionRecovery(recoveryMethod(x.Kick), "logged_in")
			case heal.Failed:
				t.deps.Metrics.ObserveSessionRecovery(recoveryMethod(x.Kick), "failed")
			}
		}
	}
	rep.Node = iscsi.NodeConditions(reports)
	m := iscsi.NewPortalMatcher(ctx, t.deps.Resolver)
	if r.Owned {
		for _, rec := range r.Listing.Records {
			if rec.State == volume.StateStaged && rec.Context.ISCSI != nil {
				rep.Volumes = append(rep.Volumes, t.volumeOf(m, t.snap, rec))
			}
		}
	}
	if r.Foreign {
		rep.Volumes = append(rep.Volumes, foreignVolumes(t.snap, r.Listing)...)
	}
	return rep
}

// RefreshTarget reads the sessions of target tg only
// (iscsi.Reader.ReadTarget) and returns its staged volumes among recs as
// they are now.
func (t *Transport) RefreshTarget(ctx context.Context, tg volume.Target, recs []volume.Record) ([]model.Volume, error) {
	var mine []volume.Record
	for _, rec := range recs {
		if rec.State == volume.StateStaged && rec.Context.ISCSI != nil && rec.Context.ISCSI.IQN == tg.Name {
			mine = append(mine, rec)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	snap, err := t.reader.ReadTarget(tg.Name, t.deps.Clock.Now())
	if err != nil {
		return nil, err
	}
	m := iscsi.NewPortalMatcher(ctx, t.deps.Resolver)
	out := make([]model.Volume, 0, len(mine))
	for _, rec := range mine {
		out = append(out, t.volumeOf(m, snap, rec))
	}
	return out, nil
}

// volumeOf is the model's entry of staged iSCSI volume rec in snap: its
// portals graded, its condition, the devices its LUN has now.
func (t *Transport) volumeOf(m *iscsi.PortalMatcher, snap *iscsi.Snapshot, rec volume.Record) model.Volume {
	v := rec.Context.ISCSI
	c, portals := iscsi.Grade(m, snap, v, t.deps.Healer)
	c.Devices = iscsi.CurrentDevices(t.deps.SysFS, snap, m, v)
	out := model.Volume{ID: rec.VolumeID, Target: iscsiTarget(v.IQN), Scope: model.Owned, Condition: c, Devices: c.Devices,
		Paths: make([]model.Path, 0, len(portals))}
	for _, p := range portals {
		out.Paths = append(out.Paths, pathOf(p))
	}
	return out
}

func pathOf(p iscsi.PortalPath) model.Path {
	mp := model.Path{Endpoint: p.Portal.String()}
	if p.Session != 0 {
		mp.Object = p.Session.String()
	}
	switch {
	case p.Live:
		mp.State, mp.Optimized = model.PathLive, true
	case p.Session != 0:
		mp.State = model.PathDown
	default:
		mp.State = model.PathAbsent
	}
	if len(p.Problems) > 0 {
		mp.Detail = p.Problems[0]
	}
	return mp
}

// foreignVolumes are the model's entries of the targets no record names
// (companion mode's): per target, its sessions, live when LOGGED_IN with
// every LUN running.
func foreignVolumes(snap *iscsi.Snapshot, l volume.Listing) []model.Volume {
	byIQN := map[string][]iscsi.Session{}
	for _, s := range snap.Sessions {
		if len(l.Of(iscsiTarget(s.TargetName)).Records) == 0 {
			byIQN[s.TargetName] = append(byIQN[s.TargetName], s)
		}
	}
	var out []model.Volume
	for _, iqn := range slices.Sorted(maps.Keys(byIQN)) {
		v := model.Volume{ID: iqn, Target: iscsiTarget(iqn), Scope: model.Foreign}
		live := 0
		for _, s := range byIQN[iqn] {
			p := model.Path{Endpoint: s.PortalString(), Object: s.ID.String(), State: model.PathDown, Detail: s.ID.String() + " " + string(s.State)}
			if s.State.LoggedIn() && allRunning(s) {
				p.State, p.Optimized, p.Detail = model.PathLive, true, ""
				live++
			}
			v.Paths = append(v.Paths, p)
			for _, lun := range s.LUNs {
				if lun.Disk != "" {
					v.Devices = append(v.Devices, volume.BlockDevice{Name: lun.Disk})
				}
			}
		}
		switch {
		case live == len(v.Paths):
			v.Condition = volume.Condition{Status: volume.Healthy}
		case live > 0:
			v.Condition = volume.Condition{Status: volume.Degraded, Reason: iscsi.ReasonPathsBelowExpected}
		default:
			v.Condition = volume.Condition{Status: volume.Inaccessible, Reason: iscsi.ReasonNoLivePath}
		}
		out = append(out, v)
	}
	return out
}

func allRunning(s iscsi.Session) bool {
	for _, l := range s.LUNs {
		if !l.Running() {
			return false
		}
	}
	return true
}

// recoveryMethod names a kick the way the metric documents it.
func recoveryMethod(k iscsi.Kick) string {
	switch k {
	case iscsi.KickRelogin:
		return "logout_login"
	case iscsi.KickRestart:
		return "iscsid_restart"
	case iscsi.KickLogin:
		return "login"
	}
	return string(k)
}

// TargetOf names the target a kernel object the model does not know
// serves: an iSCSI session (or one of its connections) created since the
// last read, from its targetname attribute — one read, fixed for the
// session's life. A SCSI device or disk below a session names the
// session too (uevent.Objects), so it needs no read of its own.
func (t *Transport) TargetOf(o uevent.Object) (volume.Target, bool) {
	s := o.Session()
	if s == "" {
		return volume.Target{}, false
	}
	iqn, err := t.deps.SysFS.ReadAttr("class/iscsi_session/" + s + "/targetname") // class/iscsi_session/<session>/targetname
	if err != nil || iqn == "" {
		return volume.Target{}, false
	}
	return iscsiTarget(iqn), true
}

// Notice does nothing: ReadTarget lists the session class every time,
// and keeps no listing for an event to make old.
func (t *Transport) Notice(uevent.Batch) {}

// PlanTarget reads target r.Target's sessions only
// (iscsi.Reader.ReadTarget) and returns its volumes as they are now: the
// staged volumes among the round's records (owned), or the target's
// sessions (foreign). It plans no job: the session heal decides on how
// long a session has been down and its portal reachable, clocks it
// advances once per tick over every session of the node, so its
// decisions stay the tick's (a session logged out or failed is below the
// heal's threshold when the kernel announces it, and iscsid may still
// recover it by itself).
func (t *Transport) PlanTarget(ctx context.Context, r model.TargetRound) model.TargetPlan {
	var p model.TargetPlan
	if r.Target.Transport != volume.TransportISCSI || (!r.Owned && !r.Foreign) {
		return p
	}
	iqn := r.Target.Name
	var mine []volume.Record
	if r.Owned {
		for _, rec := range r.Listing.Records {
			if rec.State == volume.StateStaged && rec.Context.ISCSI != nil && rec.Context.ISCSI.IQN == iqn {
				mine = append(mine, rec)
			}
		}
		if len(mine) == 0 {
			p.Why = "no staged volume of the target"
			return p
		}
	}
	snap, err := t.reader.ReadTarget(iqn, t.deps.Clock.Now())
	if err != nil {
		p.Why = "read failed: " + err.Error()
		klog.ErrorS(err, "Read of an iSCSI target after a kernel event failed; the tick reads it again", "target", iqn)
		return p
	}
	p.Read = true
	if r.Owned {
		m := iscsi.NewPortalMatcher(ctx, t.deps.Resolver)
		for _, rec := range mine {
			p.Volumes = append(p.Volumes, t.volumeOf(m, snap, rec))
		}
	} else {
		p.Volumes = foreignVolumes(snap, r.Listing)
	}
	p.Why = pathsWhy(p.Volumes) + "; the session heal decides at its tick"
	return p
}

// pathsWhy summarizes the paths of vols: "2 of 2 paths live", or the
// first path that is not and why.
func pathsWhy(vols []model.Volume) string {
	live, all := 0, 0
	var down []string
	for _, v := range vols {
		for _, p := range v.Paths {
			all++
			if p.State == model.PathLive {
				live++
				continue
			}
			d := p.Endpoint + " " + string(p.State)
			if p.Detail != "" {
				d = p.Endpoint + ": " + p.Detail
			}
			down = append(down, d)
		}
	}
	s := fmt.Sprintf("%d of %d paths live", live, all)
	if len(down) > 0 {
		s += " (" + strings.Join(down, "; ") + ")"
	}
	return s
}
