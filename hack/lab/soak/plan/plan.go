// Package plan is the soak's fault schedule: a catalogue of faults, each
// with the paths or volumes it may hit and how long it may be held, and a
// seeded planner that lays them out over a run. The schedule is a pure
// function of the seed, the run's length and the lab's topology, so a run
// that failed is replayed with its seed.
//
// The planner keeps two rules (which filesystem-error breaks on purpose,
// alone on its group: it holds every path of a group down past the
// group's queueing window; such a group takes no other fault, and its
// faults are drawn on a stream of their own, so that a seed's schedule of
// the other kinds does not depend on them). A path, a volume and pathmend itself are
// resources: two faults never hold one at once (a path is held from the
// fault until it can be back). And the time every path of a group is down
// at once, counting how long each path needs to come back after its fault
// is undone, never exceeds the group's window — the queueing window an
// outage must stay within for a filesystem to be expected to stay
// writable. Within those rules faults overlap freely: a port unlinked
// while the other port drops packets, a stuck session while its sibling
// portal is dropped (the last path: pathmend must restart iscsid),
// pathmend killed while a heal is under way.
package plan

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// Kind is a fault of the catalogue.
type Kind string

const (
	// NVMe paths.
	PortUnlink       Kind = "nvme-port-unlink"       // nvmet port unlinked from the subsystem, relinked
	NVMeDropShort    Kind = "nvme-drop-short"        // packets to the path dropped (iptables), shorter than ctrl_loss_tmo
	NVMeDropLong     Kind = "nvme-drop-long"         // dropped past ctrl_loss_tmo: the kernel deletes the controller
	NotContributing  Kind = "nvme-not-contributing"  // the alias array's namespace gets another UUID: a live controller with no leg
	ControllerDelete Kind = "nvme-controller-delete" // delete_controller written by hand
	NamespaceDisable Kind = "nvme-namespace-disable" // the volume's namespace disabled on the target, enabled again
	// iSCSI paths.
	PortalDropShort Kind = "iscsi-portal-drop-short" // packets to the portal dropped, shorter than the login timeouts
	PortalDropLong  Kind = "iscsi-portal-drop-long"  // dropped well past recovery_tmo: the session goes FREE
	TPGDisable      Kind = "iscsi-tpg-disable"       // the portal's target portal group disabled: TCP accepted, logins refused
	StuckSession    Kind = "iscsi-stuck-session"     // open-iscsi #387 through the flaky proxy
	// pathmend and the CO.
	Kill        Kind = "pathmend-kill"         // SIGKILL at a random moment, restarted
	KillInHeal  Kind = "pathmend-kill-in-heal" // SIGKILL as soon as pathmend is seen tearing down or kicking
	Restage     Kind = "volume-restage"        // unpublish, unstage, stage, publish while faults run
	RestageKill Kind = "volume-restage-kill"   // the same, pathmend SIGKILLed during the NodeUnstage or the NodeStage
	// Filesystems.
	FilesystemError Kind = "filesystem-error" // every path of a group down longer than its queueing window: the writes fail, the filesystem goes read-only
)

// Kinds lists the catalogue in a stable order.
var Kinds = []Kind{
	PortUnlink, NVMeDropShort, NVMeDropLong, NotContributing, ControllerDelete, NamespaceDisable,
	PortalDropShort, PortalDropLong, TPGDisable, StuckSession,
	Kill, KillInHeal, Restage, RestageKill, FilesystemError,
}

// Path is one path of a group: an NVMe endpoint or an iSCSI portal.
type Path struct {
	ID string `json:"id"`
	// NVMe or iSCSI.
	ISCSI bool `json:"iscsi,omitempty"`
	// Alias: the path goes to a second array that answers the
	// subsystem's NQN (NotContributing can be forced on it).
	Alias bool `json:"alias,omitempty"`
	// Proxy: the path goes through the flaky proxy (StuckSession).
	Proxy bool `json:"proxy,omitempty"`
}

// Group is the paths that serve the same volumes: an NVMe subsystem or
// an iSCSI target.
type Group struct {
	ID    string `json:"id"`
	Paths []Path `json:"paths"`
	// Window bounds the time every path of the group may be down at
	// once in the plan.
	Window time.Duration `json:"window"`
	// GivesUp: the group's controllers have a finite ctrl_loss_tmo
	// (CtrlLoss), so NVMeDropLong can outlast it.
	CtrlLoss time.Duration `json:"ctrlLoss,omitempty"`
	// FSQueue is the group's queueing window when FilesystemError may hit
	// it: the fault holds every path down longer than that, past Window.
	// Such a group takes no fault of another kind.
	FSQueue time.Duration `json:"fsQueue,omitempty"`
}

// Volume is one staged volume.
type Volume struct {
	ID    string `json:"id"`
	Group string `json:"group"`
	// Block: a raw block volume (no filesystem).
	Block bool `json:"block,omitempty"`
}

// Topology is the lab the soak runs on.
type Topology struct {
	Groups  []Group  `json:"groups"`
	Volumes []Volume `json:"volumes"`
}

// Fault is one planned fault.
type Fault struct {
	// ID numbers the faults of a plan in time order, from 1.
	ID   int  `json:"id"`
	Kind Kind `json:"kind"`
	// At is when it is injected, from the start of the run; Hold how
	// long it is held before it is undone (0: a single action).
	At   time.Duration `json:"at"`
	Hold time.Duration `json:"hold,omitempty"`
	// Group and Path name the path it hits; Volume the volume.
	Group  string `json:"group,omitempty"`
	Path   string `json:"path,omitempty"`
	Volume string `json:"volume,omitempty"`
	// During, for RestageKill: "unstage" or "stage"; KillAfter: how long
	// after the RPC starts pathmend is killed. Down, for Kill and
	// KillInHeal: how long pathmend stays down.
	During    string        `json:"during,omitempty"`
	KillAfter time.Duration `json:"killAfter,omitempty"`
	Down      time.Duration `json:"down,omitempty"`
}

func (f Fault) String() string {
	s := fmt.Sprintf("#%d %s at %s", f.ID, f.Kind, f.At.Round(time.Second))
	if f.Path != "" {
		s += " on " + f.Path
	} else if f.Group != "" && f.Volume == "" {
		s += " on every path of " + f.Group
	}
	if f.Volume != "" {
		s += " on " + f.Volume
	}
	if f.Hold > 0 {
		s += fmt.Sprintf(" held %s", f.Hold.Round(time.Second))
	}
	if f.During != "" {
		s += fmt.Sprintf(" (killed %s into the %s)", f.KillAfter.Round(10*time.Millisecond), f.During)
	}
	return s
}

// spec is what the planner knows of a kind.
type spec struct {
	weight   int
	min, max time.Duration // the hold
	// tail is how long the path needs to be back after the fault is
	// undone; the path is down (for the window rule) and held (for
	// the resource rule) until then.
	tail time.Duration
	// down: the fault takes its path down (for the window rule).
	down     bool
	eligible func(g Group, p Path, v Volume) bool
	target   string // "path", "volume" or "" (pathmend)
}

func nvmePath(_ Group, p Path, _ Volume) bool  { return !p.ISCSI }
func iscsiPath(_ Group, p Path, _ Volume) bool { return p.ISCSI }

var specs = map[Kind]spec{
	PortUnlink:       {weight: 10, min: 5 * time.Second, max: 30 * time.Second, tail: 12 * time.Second, down: true, eligible: nvmePath, target: "path"},
	NVMeDropShort:    {weight: 10, min: 5 * time.Second, max: 25 * time.Second, tail: 15 * time.Second, down: true, eligible: nvmePath, target: "path"},
	NVMeDropLong:     {weight: 4, min: 10 * time.Second, max: 30 * time.Second, tail: 20 * time.Second, down: true, target: "path", eligible: func(g Group, p Path, _ Volume) bool { return !p.ISCSI && g.CtrlLoss > 0 }},
	NotContributing:  {weight: 6, min: 15 * time.Second, max: 45 * time.Second, tail: 15 * time.Second, down: true, target: "path", eligible: func(_ Group, p Path, _ Volume) bool { return p.Alias }},
	ControllerDelete: {weight: 6, tail: 10 * time.Second, down: true, eligible: nvmePath, target: "path"},
	NamespaceDisable: {weight: 3, min: 5 * time.Second, max: 20 * time.Second, tail: 20 * time.Second, target: "volume", eligible: func(g Group, _ Path, v Volume) bool { return v.Block && !groupISCSI(g) }},
	PortalDropShort:  {weight: 10, min: 5 * time.Second, max: 25 * time.Second, tail: 20 * time.Second, down: true, eligible: iscsiPath, target: "path"},
	PortalDropLong:   {weight: 4, min: 40 * time.Second, max: 90 * time.Second, tail: 20 * time.Second, down: true, eligible: iscsiPath, target: "path"},
	TPGDisable:       {weight: 5, min: 10 * time.Second, max: 60 * time.Second, tail: 30 * time.Second, down: true, eligible: iscsiPath, target: "path"},
	StuckSession:     {weight: 4, min: 150 * time.Second, max: 150 * time.Second, tail: 30 * time.Second, down: true, target: "path", eligible: func(_ Group, p Path, _ Volume) bool { return p.Proxy }},
	Kill:             {weight: 4},
	KillInHeal:       {weight: 3, min: 60 * time.Second, max: 60 * time.Second},
	Restage:          {weight: 4, tail: 30 * time.Second, target: "volume", eligible: func(Group, Path, Volume) bool { return true }},
	RestageKill:      {weight: 3, tail: 40 * time.Second, target: "volume", eligible: func(Group, Path, Volume) bool { return true }},
	// The hold is FSQueue plus this range; the tail covers the reconnect
	// and the volume's restage.
	FilesystemError: {weight: 3, min: 6 * time.Second, max: 15 * time.Second, tail: 40 * time.Second, down: true, target: "group", eligible: func(g Group, _ Path, _ Volume) bool { return g.FSQueue > 0 }},
}

func groupISCSI(g Group) bool { return len(g.Paths) > 0 && g.Paths[0].ISCSI }

// Options shape a plan.
type Options struct {
	// MeanGap is the mean time between two faults' starts (exponential).
	MeanGap time.Duration
	// MinGap bounds it from below.
	MinGap time.Duration
	// KillGap is the least time between two pathmend kills.
	KillGap time.Duration
	// Only, when set, restricts the catalogue to these kinds.
	Only []Kind
}

// DefaultOptions is the pace of `make soak`.
var DefaultOptions = Options{MeanGap: 9 * time.Second, MinGap: 2 * time.Second, KillGap: 25 * time.Second}

// Plan is a schedule.
type Plan struct {
	Seed     uint64        `json:"seed"`
	Duration time.Duration `json:"duration"`
	Faults   []Fault       `json:"faults"`
	// Skipped counts the draws no target could take, by kind.
	Skipped map[Kind]int `json:"skipped,omitempty"`
}

// Make lays out faults over d: fault starts fall in [0, d), every fault is
// undone by d plus its own hold (the run waits for it).
func Make(seed uint64, d time.Duration, topo Topology, o Options) Plan {
	r := rand.New(rand.NewPCG(seed, 0x736f616b))
	p := Plan{Seed: seed, Duration: d, Skipped: map[Kind]int{}}
	st := newState(topo)
	kinds := Kinds
	if len(o.Only) > 0 {
		kinds = o.Only
	}
	// The kinds that take a whole group (filesystem-error) are drawn on
	// streams of their own, after the others, on groups no other kind
	// touches (state.targets): adding such a kind, or its group, leaves a
	// seed's schedule of every other kind as it was, so CI's fixed seed
	// keeps its history.
	var shared, own []Kind
	total, all := 0, 0
	for _, k := range kinds {
		all += specs[k].weight
		if specs[k].target == "group" {
			own = append(own, k)
			continue
		}
		shared = append(shared, k)
		total += specs[k].weight
	}
	if total > 0 {
		for at := gap(r, o); at < d; at += gap(r, o) {
			k := pickKind(r, shared, total)
			f, ok := st.place(r, k, at, o)
			if !ok {
				p.Skipped[k]++
				continue
			}
			p.Faults = append(p.Faults, f)
		}
	}
	for i, k := range own {
		// As often as its weight would have drawn it among all kinds.
		ko := o
		ko.MeanGap = o.MeanGap * time.Duration(all) / time.Duration(specs[k].weight)
		kr := rand.New(rand.NewPCG(seed, 0x67726f7570+uint64(i)))
		for at := gap(kr, ko); at < d; at += gap(kr, ko) {
			f, ok := st.place(kr, k, at, o)
			if !ok {
				p.Skipped[k]++
				continue
			}
			p.Faults = append(p.Faults, f)
		}
	}
	slices.SortStableFunc(p.Faults, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	for i := range p.Faults {
		p.Faults[i].ID = i + 1
	}
	if len(p.Skipped) == 0 {
		p.Skipped = nil
	}
	return p
}

func gap(r *rand.Rand, o Options) time.Duration {
	g := time.Duration(r.ExpFloat64() * float64(o.MeanGap))
	return max(g, o.MinGap)
}

func pickKind(r *rand.Rand, kinds []Kind, total int) Kind {
	n := r.IntN(total)
	for _, k := range kinds {
		n -= specs[k].weight
		if n < 0 {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

func uniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1)).Round(100*time.Millisecond)
}

// interval is [from, to).
type interval struct{ from, to time.Duration }

func (a interval) overlaps(b interval) bool { return a.from < b.to && b.from < a.to }

// state is what the planner has placed so far.
type state struct {
	topo  Topology
	busy  map[string][]interval // resource → held intervals
	down  map[string][]interval // path → down intervals
	kills []time.Duration
}

func newState(t Topology) *state {
	return &state{topo: t, busy: map[string][]interval{}, down: map[string][]interval{}}
}

// target is one place a fault can land.
type target struct {
	g Group
	p Path
	v Volume
}

func (s *state) targets(k Kind) []target {
	sp := specs[k]
	var out []target
	// A group kept for a kind that takes the whole group (FSQueue) takes
	// no other fault: see Make.
	kept := func(g Group) bool { return sp.target != "group" && g.FSQueue > 0 }
	switch sp.target {
	case "path":
		for _, g := range s.topo.Groups {
			if kept(g) {
				continue
			}
			for _, p := range g.Paths {
				if sp.eligible(g, p, Volume{}) {
					out = append(out, target{g: g, p: p})
				}
			}
		}
	case "volume":
		for _, v := range s.topo.Volumes {
			g := s.group(v.Group)
			if kept(g) {
				continue
			}
			if sp.eligible(g, Path{}, v) {
				out = append(out, target{g: g, v: v})
			}
		}
	case "group":
		for _, g := range s.topo.Groups {
			if sp.eligible(g, Path{}, Volume{}) {
				out = append(out, target{g: g})
			}
		}
	default:
		out = append(out, target{})
	}
	return out
}

func (s *state) group(id string) Group {
	for _, g := range s.topo.Groups {
		if g.ID == id {
			return g
		}
	}
	return Group{}
}

// place tries every target of k at at, in random order, and books the
// first that keeps the rules.
func (s *state) place(r *rand.Rand, k Kind, at time.Duration, o Options) (Fault, bool) {
	sp := specs[k]
	ts := s.targets(k)
	r.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
	hold := uniform(r, sp.min, sp.max)
	if k == NVMeDropLong || k == FilesystemError {
		// Past the group's ctrl_loss_tmo or queueing window, wherever
		// it lands.
		hold = 0
	}
	f := Fault{Kind: k, At: at.Truncate(100 * time.Millisecond), Hold: hold}
	switch k {
	case RestageKill:
		f.During = []string{"unstage", "stage"}[r.IntN(2)]
		f.KillAfter = uniform(r, 0, 1500*time.Millisecond).Round(10 * time.Millisecond)
		f.Down = uniform(r, 0, 3*time.Second)
	case Kill, KillInHeal:
		f.Down = uniform(r, 0, 3*time.Second)
	}
	if k == Kill || k == KillInHeal || k == RestageKill {
		for _, t := range s.kills {
			if math.Abs(float64(t-f.At)) < float64(o.KillGap) {
				return Fault{}, false
			}
		}
	}
	for _, t := range ts {
		g := f
		switch k {
		case NVMeDropLong:
			g.Hold = t.g.CtrlLoss + uniform(r, sp.min, sp.max)
		case FilesystemError:
			g.Hold = t.g.FSQueue + uniform(r, sp.min, sp.max)
		}
		if !s.fits(k, g, t) {
			continue
		}
		g.Group, g.Path, g.Volume = t.g.ID, t.p.ID, t.v.ID
		s.book(k, g, t)
		return g, true
	}
	return Fault{}, false
}

func (s *state) span(k Kind, f Fault) interval {
	return interval{f.At, f.At + f.Hold + specs[k].tail}
}

func (s *state) resource(k Kind, t target) string {
	switch specs[k].target {
	case "path":
		return "path:" + t.p.ID
	case "volume":
		return "volume:" + t.v.ID
	}
	return ""
}

func (s *state) fits(k Kind, f Fault, t target) bool {
	span := s.span(k, f)
	if specs[k].target == "group" {
		// Every path of the group, free of any other fault the whole
		// time: the group's every-path-down span is this fault's alone
		// (past its Window on purpose), and nothing else overlaps it.
		for _, p := range t.g.Paths {
			for _, iv := range append(slices.Clone(s.busy["path:"+p.ID]), s.down[p.ID]...) {
				if iv.overlaps(span) {
					return false
				}
			}
		}
		return true
	}
	if res := s.resource(k, t); res != "" {
		for _, iv := range s.busy[res] {
			if iv.overlaps(span) {
				return false
			}
		}
	}
	if specs[k].down {
		down := slices.Clone(s.down[t.p.ID])
		down = append(down, span)
		if s.allDownLongest(t.g, t.p.ID, down) > t.g.Window {
			return false
		}
	}
	return true
}

func (s *state) book(k Kind, f Fault, t target) {
	span := s.span(k, f)
	if specs[k].target == "group" {
		for _, p := range t.g.Paths {
			s.busy["path:"+p.ID] = append(s.busy["path:"+p.ID], span)
			s.down[p.ID] = append(s.down[p.ID], span)
		}
		return
	}
	if res := s.resource(k, t); res != "" {
		s.busy[res] = append(s.busy[res], span)
	}
	if specs[k].down {
		s.down[t.p.ID] = append(s.down[t.p.ID], span)
	}
	if k == Kill || k == KillInHeal || k == RestageKill {
		s.kills = append(s.kills, f.At)
	}
}

// allDownLongest is the longest time every path of g is down at once,
// with path id's down intervals replaced by down.
func (s *state) allDownLongest(g Group, id string, down []interval) time.Duration {
	var acc []interval
	for i, p := range g.Paths {
		ivs := s.down[p.ID]
		if p.ID == id {
			ivs = down
		}
		u := union(ivs)
		if i == 0 {
			acc = u
			continue
		}
		acc = intersect(acc, u)
	}
	var longest time.Duration
	for _, iv := range acc {
		longest = max(longest, iv.to-iv.from)
	}
	return longest
}

// union merges overlapping intervals, sorted.
func union(ivs []interval) []interval {
	s := slices.Clone(ivs)
	sort.Slice(s, func(i, j int) bool { return s[i].from < s[j].from })
	var out []interval
	for _, iv := range s {
		if n := len(out); n > 0 && iv.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, iv.to)
			continue
		}
		out = append(out, iv)
	}
	return out
}

// intersect intersects two sorted, disjoint interval lists.
func intersect(a, b []interval) []interval {
	var out []interval
	for i, j := 0, 0; i < len(a) && j < len(b); {
		from, to := max(a[i].from, b[j].from), min(a[i].to, b[j].to)
		if from < to {
			out = append(out, interval{from, to})
		}
		if a[i].to < b[j].to {
			i++
		} else {
			j++
		}
	}
	return out
}

// End is when the last fault is undone and its path is expected back.
func (p Plan) End() time.Duration {
	end := p.Duration
	for _, f := range p.Faults {
		end = max(end, f.At+f.Hold+specs[f.Kind].tail)
	}
	return end
}

// Tail is how long after being undone the kind's path is expected back.
func Tail(k Kind) time.Duration { return specs[k].tail }

// TakesPathDown reports whether the kind takes its path down.
func TakesPathDown(k Kind) bool { return specs[k].down }
