package iscsi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Defaults of HealerConfig.
const (
	// DefaultThreshold is how long a session must be down, with its portal
	// reachable without interruption, before the heal kicks it: twice
	// iscsid's login_timeout (15 s) plus 15 s. iscsid 2.1.8 retries a
	// reopen every login_timeout and relogs in 2–6 s after a portal comes
	// back, so a session still down after this is stuck, not recovering.
	DefaultThreshold        = 45 * time.Second
	DefaultReloginCooldown  = 2 * time.Minute
	DefaultRestartCooldown  = 10 * time.Minute
	DefaultVerifyWindow     = 2 * time.Minute
	DefaultProbeConcurrency = 8
)

// Kick is what the heal does to a stuck session.
type Kick string

const (
	// KickLogin logs in a node record of a staged volume that has no
	// session at all (a login that failed, a session logged out).
	KickLogin Kick = "login"
	// KickRelogin logs out this one session by SID, then logs in its node
	// record: its disks are deleted and re-created on a new session. Only
	// when every LUN of the session has another live path or no staged
	// volume uses it.
	KickRelogin Kick = "logout-login"
	// KickRestart restarts iscsid: every session on the node is bounced
	// for about two seconds, devices kept. For a session that is the last
	// path of a device in use; at most once per restart cooldown.
	KickRestart Kick = "restart-iscsid"
)

// HealScope says which sessions the heal may kick. Every session is
// observed and reported whatever the scope.
type HealScope string

const (
	// HealStaged kicks only sessions to targets of staged volumes.
	HealStaged HealScope = "staged"
	// HealAll kicks any session on the node. LUNs of targets pathmend did
	// not stage are in use as the node shows them (HealerConfig.Use:
	// mounted, held, bound), or, with no Use, always: their last paths
	// then get an iscsid restart, never a logout.
	HealAll HealScope = "all"
	// HealForeign kicks only sessions of targets no staged-volume record
	// names, in any state: companion mode beside a node plugin, which
	// owns its own targets' sessions. As in all, their LUNs' use is read
	// from the node, and an absent portal of a staged volume is not its
	// to log in.
	HealForeign HealScope = "foreign"
)

// InScope reports whether scope lets the heal kick a session of a
// target that volumes (the records naming it, in any state) use.
func (s HealScope) InScope(volumes int) bool {
	switch s {
	case HealAll:
		return true
	case HealForeign:
		return volumes == 0
	}
	return volumes > 0
}

// SessionAbsent is the State reported for a portal of a staged volume that
// has no session at all. It is not a kernel state.
const SessionAbsent SessionState = "absent"

// Kicker is the mechanism the heal drives; *Initiator implements it.
type Kicker interface {
	// Login logs in node record n; a session already present is success.
	Login(ctx context.Context, n Node) error
	// Logout logs out session sid of node record n.
	Logout(ctx context.Context, n Node, sid SessionID) error
	// RestartDaemon restarts iscsid, refusing with ErrInFlight while a
	// login or logout runs.
	RestartDaemon(ctx context.Context) error
}

// Stamps remembers node-wide times across restarts of the process;
// *volume.Store implements it in the state directory.
type Stamps interface {
	Stamp(name string) (t time.Time, ok bool, err error)
	SetStamp(name string, t time.Time) error
}

// restartStamp is the stamp of the last iscsid restart.
const restartStamp = "iscsid-restart"

// HealerConfig configures a SessionHealer.
type HealerConfig struct {
	// Policy is the process's heal policy, shared with the NVMe heal: its
	// mode is the heal's, and its cooldown (--heal-cooldown) holds every
	// login and relogin of a node record, in the same table as the NVMe
	// repairs. When nil, Mode and ReloginCooldown are used instead.
	Policy *heal.Policy
	// Mode is repair, observe or off (heal.ParseMode of --heal); with a
	// Policy it must be empty or the Policy's.
	Mode heal.Mode
	// Scope is staged (default), all or foreign.
	Scope HealScope
	// Disabled lists kick kinds the heal decides on but never runs, each
	// with the flag that would enable it: companion mode's per-action
	// flags. A disabled kick's verdict is observed (class
	// action_disabled).
	Disabled map[Kick]string
	// Threshold, ReloginCooldown, RestartCooldown and VerifyWindow: zero
	// means the Default of the same name. Threshold is both how long a
	// session must be down and how long its portal must have been
	// reachable without interruption. VerifyWindow is how long a kick has
	// to bring the session to LOGGED_IN before it counts as failed.
	Threshold, ReloginCooldown, RestartCooldown, VerifyWindow time.Duration
	// ProbeConcurrency bounds the portals probed at once.
	ProbeConcurrency int
	// Iface is the open-iscsi iface the attacher logs in with, used for
	// portals of staged volumes that have no session (a session's own
	// iface comes from sysfs); DefaultIface when empty.
	Iface string
	// Use reads whether a LUN's device (its map, or its disk) is in use
	// on the node, for every target: the ladder's choice between a
	// relogin and the restart (ChooseKick). When nil, a last path of a
	// target no staged volume uses counts as in use.
	Use DeviceUse
	// Kicker runs logins, logouts and the restart. Required.
	Kicker Kicker
	// Prober checks portals. Required (&NetProber{} on a node).
	Prober Prober
	// Resolver resolves host names in volume portals; net.DefaultResolver
	// when nil.
	Resolver Resolver
	// Stamps, when set, keeps the time of the last iscsid restart, so the
	// restart budget survives a restart of pathmend.
	Stamps Stamps
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Report is what one tick found about one session (or one portal of a
// staged volume without a session) and what the heal decided.
type Report struct {
	// Session is the kernel session; 0 for an absent one.
	Session SessionID
	// Node is the session's node record: target, portal, iface.
	Node Node
	// State is the session state, or SessionAbsent.
	State SessionState
	// InScope is set when the heal may kick the session.
	InScope bool
	// Volumes are the staged volumes of the session's target.
	Volumes []string
	// DownFor is how long the session has been out of LOGGED_IN and
	// TimeInState how long in its current state, both as observed by this
	// process (the clocks start at first sighting).
	DownFor, TimeInState time.Duration
	// Probe is this tick's reachability of the portal; nil when the
	// session is up or out of scope (not probed).
	Probe *Reachability
	// ReachableFor is how long the portal has been reachable without a
	// failed probe.
	ReachableFor time.Duration
	// Verdict is empty while there is nothing to decide (up, or down for
	// less than the threshold, or a kick awaiting its outcome).
	Verdict heal.Verdict
	// Kick is the kick chosen (or run, or awaited).
	Kick Kick
	// Reason explains the verdict; Class is its bounded form (the
	// metric's reason label), set with every Verdict.
	Reason string
	Class  heal.Class
	// Owed is set on the report of a node record pathmend logged out
	// whose login has not succeeded since: nothing else logs it in again
	// (iscsid retries sessions, not absent ones), so the heal keeps
	// logging it in, one try per cooldown, until it is LOGGED_IN.
	Owed bool
	// NewSession and TimeToLoggedIn are set on the Repaired report of a
	// kick that brought the node record back to LOGGED_IN. TimeToLoggedIn
	// counts from the start of the kick: a login that hangs for 30 s
	// before it succeeds is part of it.
	NewSession     SessionID
	TimeToLoggedIn time.Duration
	// Err is the error of a Failed kick.
	Err error
}

// SessionHealer watches every iSCSI session on the node, tick after tick,
// and kicks the ones stuck out of LOGGED_IN while their portal is
// reachable. It never writes recovery_tmo. Build one per process; the
// loop drives it through its transport (pkg/iscsi/iscsiheal) each tick:
// Plan decides (and runs the node-wide iscsid restart), Kick runs the
// logins and relogins planned for one target as that target's job, with
// its lease, and Settle reads what became of them and returns the tick's
// reports. Plan and Settle are called by one loop, one tick at a time;
// Kick may run on any goroutine. It implements attach.SessionClocks
// through DownFor.
type SessionHealer struct {
	cfg HealerConfig

	mu       sync.Mutex
	down     *heal.Streaks // session or node key → out of LOGGED_IN
	inState  *heal.Streaks // session+state → in that state
	reach    *heal.Streaks // portal → reachable
	kicked   cooldowns     // node key → last login or relogin
	restart  *heal.Window  // restartKey → last iscsid restart
	gate     *heal.LogGate
	pending  map[string]pending // node key → kick awaiting LOGGED_IN
	rejected map[string]error   // node key → the target's login rejection
	owed     map[string]owed    // node key → logged out by a kick, not back

	// round holds the reports of the tick between Plan and Settle, and
	// planned the kicks Plan decided that Settle has not settled yet, by
	// target.
	round     []*Report
	planned   map[string][]Report
	plannedAt time.Time

	// results are the outcomes of kicks run as target jobs, read by the
	// next Settle or Plan; toRun are the planned kicks not yet taken by
	// their target's job. resMu guards both (a job never takes mu).
	resMu   sync.Mutex
	results []kickResult
	toRun   map[string][]Report
}

// owed is a node record a kick logged out and that has not been LOGGED_IN
// since: a relogin whose login failed, or did not bring the session back
// within the verify window. The heal logs it in again until it is back.
type owed struct {
	node Node
	// since is when the kick that logged it out began.
	since time.Time
	// staged is set when staged volumes used the target at that time: once
	// none does (the volumes were unstaged, and their detach owns the
	// sessions), the debt is void. A node of a target pathmend never
	// staged (heal scope all) stays owed until it is LOGGED_IN or its node
	// record is gone.
	staged bool
}

// cooldowns holds the login and relogin cooldowns: the Policy's table, or
// a Window of its own.
type cooldowns interface {
	Left(key string) (left, ago time.Duration)
	MarkAt(key string, t time.Time)
}

// pending is a kick that ran and whose session is not LOGGED_IN yet.
type pending struct {
	at     time.Time // when the kick began
	report Report    // as decided, for the final verdict line
}

// restartKey is the one key of the per-node restart window.
const restartKey = "iscsid"

// NewSessionHealer validates cfg and returns a healer. Nothing runs.
func NewSessionHealer(cfg HealerConfig) (*SessionHealer, error) {
	if cfg.Policy != nil {
		if cfg.Mode != "" && cfg.Mode != cfg.Policy.Mode() {
			return nil, fmt.Errorf("session healer: mode %q differs from the policy's %q", cfg.Mode, cfg.Policy.Mode())
		}
		if cfg.ReloginCooldown != 0 {
			return nil, errors.New("session healer: with a policy, its cooldown holds logins and relogins")
		}
		cfg.Mode = cfg.Policy.Mode()
	}
	if _, err := heal.ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	switch cfg.Scope {
	case "":
		cfg.Scope = HealStaged
	case HealStaged, HealAll, HealForeign:
	default:
		return nil, fmt.Errorf("invalid heal scope %q: want staged, all or foreign", cfg.Scope)
	}
	if cfg.Kicker == nil || cfg.Prober == nil {
		return nil, errors.New("session healer: kicker and prober are required")
	}
	if cfg.Threshold < 0 || cfg.ReloginCooldown < 0 || cfg.RestartCooldown < 0 || cfg.VerifyWindow < 0 || cfg.ProbeConcurrency < 0 {
		return nil, errors.New("session healer: durations and concurrency must not be negative")
	}
	setDur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	setDur(&cfg.Threshold, DefaultThreshold)
	setDur(&cfg.ReloginCooldown, DefaultReloginCooldown)
	setDur(&cfg.RestartCooldown, DefaultRestartCooldown)
	setDur(&cfg.VerifyWindow, DefaultVerifyWindow)
	if cfg.ProbeConcurrency == 0 {
		cfg.ProbeConcurrency = DefaultProbeConcurrency
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &SessionHealer{
		cfg:      cfg,
		down:     heal.NewStreaks(cfg.Now),
		inState:  heal.NewStreaks(cfg.Now),
		reach:    heal.NewStreaks(cfg.Now),
		restart:  heal.NewWindow(cfg.RestartCooldown, cfg.Now),
		gate:     heal.NewLogGate(0, cfg.Now),
		pending:  map[string]pending{},
		rejected: map[string]error{},
		owed:     map[string]owed{},
	}
	if cfg.Policy != nil {
		h.kicked = cfg.Policy
	} else {
		h.kicked = heal.NewWindow(cfg.ReloginCooldown, cfg.Now)
	}
	if cfg.Stamps != nil {
		t, ok, err := cfg.Stamps.Stamp(restartStamp)
		if err != nil {
			return nil, fmt.Errorf("session healer: last iscsid restart: %w", err)
		}
		if ok {
			h.restart.MarkAt(restartKey, t)
		}
	}
	return h, nil
}

// DownFor returns how long this process has seen session id out of
// LOGGED_IN; ok is false when it is up or unknown.
func (h *SessionHealer) DownFor(id SessionID) (time.Duration, bool) {
	return h.down.Held(sessionKey(id))
}

// Plan takes one look: snap is this tick's Read, records the staged
// volumes (any transport; non-iSCSI ones are ignored), recordsErr the
// error of listing them when some could not be read: the readable ones
// still set the scope, but no session is then logged out as if its disks
// were unused (see ChooseKick). It updates the clocks, probes the portals
// of down sessions, settles the kicks whose jobs ended, and decides on
// each stuck one (narrowest kick first, at most one iscsid restart). In
// repair mode the restart, which bounces every session of the node and
// belongs to no target, runs here; the logins and relogins it allows are
// planned for their target's job (Kick), and Plan returns those targets'
// IQNs, sorted. Call Settle before the next Plan. In off mode it does
// nothing.
func (h *SessionHealer) Plan(ctx context.Context, snap *Snapshot, records []volume.Record, recordsErr error) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.round, h.planned = nil, map[string][]Report{}
	if h.cfg.Mode == heal.ModeOff || snap == nil {
		return nil
	}
	recs := iscsiRecords(records)
	m := NewPortalMatcher(ctx, h.cfg.Resolver)
	reports := h.observe(ctx, m, snap, recs)
	h.probe(ctx, reports)
	h.readResults(reports)
	h.resolvePending(reports)
	h.plannedAt = h.cfg.Now()
	h.decide(ctx, snap, recs, recordsErr == nil, reports)
	h.round = reports
	h.resMu.Lock()
	if h.toRun == nil {
		h.toRun = map[string][]Report{}
	}
	for iqn, ks := range h.planned {
		h.toRun[iqn] = append(h.toRun[iqn], ks...)
	}
	h.resMu.Unlock()
	return slices.Sorted(maps.Keys(h.planned))
}

// Kick runs the logins and relogins Plan planned for target iqn, once:
// the target's job. With lease (iqn's), each kick is first checked
// against the target's records under it: a login of an absent portal is
// run only while a staged volume lists it, a relogin only while some
// volume of the target is not detaching (stillWanted). Its outcomes are
// read by Settle, or by the next Plan when it ends later.
func (h *SessionHealer) Kick(ctx context.Context, iqn string, lease *intent.Lease) {
	h.resMu.Lock()
	kicks := h.toRun[iqn]
	delete(h.toRun, iqn)
	h.resMu.Unlock()
	for _, kr := range kicks {
		klog.FromContext(ctx).V(2).Info("Kicking iSCSI session", "session", kr.Session.String(), "target", kr.Node.Target, "portal", kr.Node.Portal.String(), "kick", kr.Kick)
		res := kickResult{key: kr.Node.key(), node: kr.Node}
		why := ""
		if lease != nil {
			why = stillWanted(ctx, h.cfg.Resolver, h.cfg.Scope, lease, kr)
		}
		if why != "" {
			res.skipped = why
		} else {
			res.loggedOut, res.err = h.runKick(ctx, kr)
		}
		h.resMu.Lock()
		h.results = append(h.results, res)
		h.resMu.Unlock()
	}
}

// Settle ends the tick Plan began: the kicks of a target in busy (its
// lease was held by another actor: the holder) are deferred; the others
// began when Plan decided them, so their cooldown and their clock start
// then, and they await LOGGED_IN; the kicks whose jobs ended are read. It
// returns one Report per session and per absent portal of a staged
// volume, sorted by target, portal and session; nil in off mode. Every
// verdict is logged once at level 0.
func (h *SessionHealer) Settle(busy map[string]string) []Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	reports := h.round
	if reports == nil {
		return nil
	}
	for _, iqn := range slices.Sorted(maps.Keys(h.planned)) {
		holder, isBusy := busy[iqn]
		if isBusy {
			h.resMu.Lock()
			delete(h.toRun, iqn)
			h.resMu.Unlock()
		}
		for _, kr := range h.planned[iqn] {
			r := reportOf(reports, kr.Node.key(), kr.Session)
			if isBusy {
				r.Verdict, r.Class, r.Reason = heal.Deferred, heal.ClassTargetBusy, "target busy: "+holder
				h.logVerdict(*r)
				continue
			}
			// The kick has begun: its cooldown and its clock start when
			// it was decided, whatever the login takes.
			h.kicked.MarkAt(r.Node.HealKey(), h.plannedAt)
			r.Verdict = heal.Kicked
			h.pending[r.Node.key()] = pending{at: h.plannedAt, report: *r}
		}
	}
	h.planned = nil
	h.readResults(reports) // kicks a synchronous runner ran already
	h.sweep(reports)
	h.round = nil

	out := make([]Report, len(reports))
	for i, r := range reports {
		out[i] = *r
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node.Target != b.Node.Target {
			return a.Node.Target < b.Node.Target
		}
		if a.Node.Portal != b.Node.Portal {
			return a.Node.Portal.String() < b.Node.Portal.String()
		}
		return a.Session < b.Session
	})
	return out
}

// reportOf returns the report of node record key and session sid.
func reportOf(reports []*Report, key string, sid SessionID) *Report {
	for _, r := range reports {
		if r.Node.key() == key && r.Session == sid {
			return r
		}
	}
	return &Report{}
}

// sweep bounds memory to what this tick saw.
func (h *SessionHealer) sweep(reports []*Report) {
	seen := map[string]bool{}
	for _, r := range reports {
		seen[r.Node.key()] = true
	}
	for k := range h.rejected {
		if !seen[k] {
			delete(h.rejected, k)
		}
	}
	h.down.Sweep()
	h.inState.Sweep()
	h.reach.Sweep()
	if w, ok := h.kicked.(*heal.Window); ok {
		w.Prune()
	}
	h.restart.Prune()
	h.gate.Prune()
}

func sessionKey(id SessionID) string { return "sid:" + strconv.Itoa(int(id)) }

// stagedOnly keeps the records in state staged: the volumes whose absent
// portals the heal logs in (an attaching one is being logged in by its
// NodeStage, a detaching one was logged out on purpose).
func stagedOnly(recs []volume.Record) []volume.Record {
	var out []volume.Record
	for _, r := range recs {
		if r.State == volume.StateStaged {
			out = append(out, r)
		}
	}
	return out
}

// iscsiRecords keeps the staged volumes of transport iscsi.
func iscsiRecords(records []volume.Record) []volume.Record {
	var out []volume.Record
	for _, r := range records {
		if r.Context.Transport == volume.TransportISCSI && r.Context.ISCSI != nil {
			out = append(out, r)
		}
	}
	return out
}

// volumesOf returns the sorted IDs of the staged volumes of target iqn.
func volumesOf(recs []volume.Record, iqn string) []string {
	var ids []string
	for _, r := range recs {
		if r.Context.ISCSI.IQN == iqn {
			ids = append(ids, r.VolumeID)
		}
	}
	sort.Strings(ids)
	return ids
}
