// Package report turns what the soak did and saw into its verdict: the
// faults injected, pathmend's heals and how long the volumes took to get
// every path back, the writers' I/O errors with the faults that were
// active, and the checks that must be zero — data mismatches, healthy
// paths torn down, read-only remounts no outage explains, kernel objects
// left behind. It renders the report as text and as JSON, and on a failed
// check the seed and the timeline around each failure.
package report

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/observe"
	"github.com/pathmend/pathmend/hack/lab/soak/plan"
	"github.com/pathmend/pathmend/hack/lab/soak/workload"
)

// FaultRun is one planned fault as it was run.
type FaultRun struct {
	plan.Fault
	// Injected and Undone are when the fault was put in place and taken
	// away (Undone zero: a single action, or never undone). For a stuck
	// session, Injected is when the stuck state was reached.
	Injected time.Time `json:"injected,omitzero"`
	Undone   time.Time `json:"undone,omitzero"`
	// Result is "done", "skipped" (a precondition did not hold: Note
	// says which) or "failed" (Note says how).
	Result string `json:"result"`
	Note   string `json:"note,omitempty"`
	// Volumes are the volumes the fault's path or volume serves.
	Volumes []string `json:"volumes,omitempty"`
	// Objects are kernel objects the soak itself removed (a controller
	// deleted by hand, "nvme3@<created>").
	Objects []string `json:"objects,omitempty"`
}

// Action is something the soak did as the CO or the node's operator.
type Action struct {
	At  time.Time `json:"at"`
	End time.Time `json:"end,omitzero"`
	// What: "stage", "unstage", "publish", "unpublish", "kill",
	// "start", "recover".
	What   string `json:"what"`
	Volume string `json:"volume,omitempty"`
	Err    string `json:"err,omitempty"`
	Note   string `json:"note,omitempty"`
	// Attempts is how many times a CSI call was made (kubelet retries a
	// failed one): more than one is a retry the report counts.
	Attempts int `json:"attempts,omitempty"`
	// FirstErr is the first attempt's error when there were several.
	FirstErr string `json:"firstErr,omitempty"`
}

// Volume is one volume as the report needs it.
type Volume struct {
	Spec observe.VolumeSpec `json:"spec"`
	// Target is its subsystem NQN or target IQN.
	Target string `json:"target"`
	Block  bool   `json:"block,omitempty"`
	// Window is the documented queueing window: every path down for
	// less than this must not cost the filesystem.
	Window time.Duration  `json:"window"`
	Stats  workload.Stats `json:"-"`
	// Verifications are the full read passes (after each restage and at
	// the end).
	Verifications []Verification `json:"verifications,omitempty"`
}

// Verification is one full read of a volume's blocks.
type Verification struct {
	At         time.Time `json:"at"`
	Why        string    `json:"why"`
	Blocks     int       `json:"blocks"`
	Mismatched int       `json:"mismatched"`
	Undefined  int       `json:"undefined"`
	Err        string    `json:"err,omitempty"`
}

// ReadOnly is a filesystem found read-only: by the kernel's "Remounting
// filesystem read-only" line or a writer's EROFS.
type ReadOnly struct {
	Volume string    `json:"volume"`
	At     time.Time `json:"at"`
	Source string    `json:"source"`
}

// Input is everything a run produced.
type Input struct {
	Seed       uint64
	Start, End time.Time
	Plan       plan.Plan
	Faults     []FaultRun
	Actions    []Action
	Tracker    *observe.Tracker
	Volumes    []Volume
	Log        []LogLine
	ReadOnly   []ReadOnly
	Orphans    []string
	// Kernel is the storage lines of the kernel log, for the timeline.
	Kernel []Event
	// Retries are steps the soak made again besides its CSI calls, each
	// with its cause (an attempt at a stuck iSCSI session that lost the
	// race against iscsid).
	Retries []string
}

// Event is one line of the timeline.
type Event struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

// Latency summarises heal latencies of one fault kind.
type Latency struct {
	N        int     `json:"n"`
	P50      float64 `json:"p50Seconds"`
	P99      float64 `json:"p99Seconds"`
	Max      float64 `json:"maxSeconds"`
	Unhealed int     `json:"unhealed,omitempty"`
}

// Window is a stretch of I/O errors on one volume.
type Window struct {
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Errors int       `json:"errors"`
	First  string    `json:"first"`
	// Faults are the faults active on the volume meanwhile ("#12
	// nvme-drop-short"); AllDown whether every path was down.
	Faults  []string `json:"faults,omitempty"`
	AllDown bool     `json:"allDown,omitempty"`
}

// VolumeReport is one volume's I/O.
type VolumeReport struct {
	ID            string             `json:"id"`
	Writes        int                `json:"writes"`
	Reads         int                `json:"reads"`
	WriteErrors   int                `json:"writeErrors"`
	ReadErrors    int                `json:"readErrors"`
	Mismatches    int                `json:"mismatches"`
	Undefined     int                `json:"undefined"`
	ErrorWindows  []Window           `json:"errorWindows,omitempty"`
	Stalls        int                `json:"stalls"`
	SlowestOp     float64            `json:"slowestOpSeconds"`
	AllDown       []observe.Span     `json:"allDown,omitempty"`
	Replaced      []observe.Replaced `json:"replaced,omitempty"`
	Verifications []Verification     `json:"verifications,omitempty"`
	Findings      []workload.Event   `json:"findings,omitempty"`
}

// Teardown is a controller or session that went away while healthy.
type Teardown struct {
	observe.Gone
	// Verdict is pathmend's log line that names it, if any.
	Verdict string `json:"verdict,omitempty"`
}

// Checks are the must-be-zero results.
type Checks struct {
	DataMismatches      int `json:"dataMismatches"`
	HealthyTeardowns    int `json:"healthyTeardowns"`
	ReadOnlyUnexplained int `json:"readOnlyRemountsUnexplained"`
	Orphans             int `json:"orphanedKernelObjects"`
}

// Report is the soak's result.
type Report struct {
	Seed     uint64    `json:"seed"`
	Start    time.Time `json:"start"`
	Duration float64   `json:"durationSeconds"`
	Pass     bool      `json:"pass"`
	Checks   Checks    `json:"checks"`
	Failures []string  `json:"failures,omitempty"`

	Faults      map[string]map[string]int `json:"faults"`
	Heals       map[string]map[string]int `json:"heals"`
	HealLatency map[string]Latency        `json:"healLatency"`
	Volumes     []VolumeReport            `json:"volumes"`
	Teardowns   []Teardown                `json:"healthyTeardowns,omitempty"`
	// Unverifiable are teardowns of a path last seen healthy whose path
	// had a fault put on it between that sample and the teardown.
	Unverifiable []Teardown        `json:"unverifiableTeardowns,omitempty"`
	ReadOnly     []ReadOnlyVerdict `json:"readOnlyRemounts,omitempty"`
	Bounced      int               `json:"sessionsBouncedByIscsidRestarts"`
	Orphans      []string          `json:"orphans,omitempty"`
	// KernelCrashes are the kernel's oops and BUG lines: after one the
	// kernel's state, and every check above, is not to be trusted.
	KernelCrashes []Event    `json:"kernelCrashes,omitempty"`
	Samples       int        `json:"observerSamples"`
	MaxGap        float64    `json:"observerMaxGapSeconds"`
	Runs          []FaultRun `json:"faultRuns"`
	Actions       []Action   `json:"actions"`
	Timeline      []Event    `json:"-"`
	// Retries is every step made again, with its cause: CSI calls
	// retried as kubelet retries them (pathmend answered an error a
	// retry cures: a kill mid-call, a target busy), and the soak's own
	// retries (Input.Retries). Counted in the verdict line; none fails
	// the run, each is for a reader to judge.
	Retries    []string `json:"retries,omitempty"`
	RetryCount int      `json:"retryCount"`
}

// ReadOnlyVerdict is a read-only remount and what explains it.
type ReadOnlyVerdict struct {
	ReadOnly
	// AllDown is the longest every-path-down span before it, and
	// Window the queueing window.
	AllDown   float64 `json:"allDownSeconds"`
	Window    float64 `json:"windowSeconds"`
	Explained bool    `json:"explained"`
}

// Build computes the report.
func Build(in Input) Report {
	r := Report{
		Seed: in.Seed, Start: in.Start, Duration: in.End.Sub(in.Start).Seconds(),
		Faults: map[string]map[string]int{}, Heals: map[string]map[string]int{}, HealLatency: map[string]Latency{},
		Runs: in.Faults, Actions: in.Actions, Orphans: in.Orphans,
	}
	if in.Tracker != nil {
		r.Samples, r.MaxGap = in.Tracker.Samples, in.Tracker.MaxGap.Seconds()
	}
	for _, a := range in.Actions {
		if a.Attempts > 1 {
			r.Retries = append(r.Retries, fmt.Sprintf("%s %s at %s: %d attempts; the first failed: %s",
				a.What, a.Volume, a.At.Sub(in.Start).Round(100*time.Millisecond), a.Attempts, a.FirstErr))
		}
	}
	r.Retries = append(r.Retries, in.Retries...)
	r.RetryCount = len(r.Retries)
	for _, f := range in.Faults {
		inc(r.Faults, string(f.Kind), f.Result)
	}
	heals := Heals(in.Log)
	for _, h := range heals {
		inc(r.Heals, h.Kind, h.Verdict)
	}
	r.latencies(in)
	for _, v := range in.Volumes {
		r.Volumes = append(r.Volumes, volumeReport(in, v))
	}
	r.teardowns(in, heals)
	r.readOnly(in)
	r.Bounced = bounced(in)
	for _, v := range r.Volumes {
		r.Checks.DataMismatches += v.Mismatches
	}
	r.Checks.HealthyTeardowns = len(r.Teardowns)
	for _, ro := range r.ReadOnly {
		if !ro.Explained {
			r.Checks.ReadOnlyUnexplained++
		}
	}
	r.Checks.Orphans = len(in.Orphans)
	for _, e := range in.Kernel {
		if KernelCrash(strings.TrimPrefix(e.What, "kernel: ")) {
			r.KernelCrashes = append(r.KernelCrashes, e)
		}
	}
	r.failures(in)
	r.Pass = len(r.Failures) == 0
	r.Timeline = timeline(in, heals)
	return r
}

func inc(m map[string]map[string]int, a, b string) {
	if m[a] == nil {
		m[a] = map[string]int{}
	}
	m[a][b]++
}

// latencies: for each fault undone (or done, for a single action), the
// time until every path of every volume it touched was up again.
func (r *Report) latencies(in Input) {
	by := map[plan.Kind][]time.Duration{}
	unhealed := map[plan.Kind]int{}
	for _, f := range in.Faults {
		if f.Result != "done" || len(f.Volumes) == 0 || in.Tracker == nil {
			continue
		}
		from := f.Undone
		if from.IsZero() {
			from = f.Injected
		}
		if from.IsZero() {
			continue
		}
		var worst time.Duration
		ok := true
		for _, v := range f.Volumes {
			at, up := in.Tracker.AllUpAt(v, from)
			if !up {
				ok = false
				break
			}
			worst = max(worst, at.Sub(from))
		}
		if !ok {
			unhealed[f.Kind]++
			continue
		}
		by[f.Kind] = append(by[f.Kind], worst)
	}
	for _, k := range plan.Kinds {
		ds := by[k]
		if len(ds) == 0 && unhealed[k] == 0 {
			continue
		}
		slices.Sort(ds)
		l := Latency{N: len(ds), Unhealed: unhealed[k]}
		if len(ds) > 0 {
			l.P50, l.P99, l.Max = pct(ds, 0.50).Seconds(), pct(ds, 0.99).Seconds(), ds[len(ds)-1].Seconds()
		}
		r.HealLatency[string(k)] = l
	}
}

// pct is the nearest-rank percentile of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	i := int(float64(len(ds))*p+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func volumeReport(in Input, v Volume) VolumeReport {
	s := v.Stats
	vr := VolumeReport{
		ID: v.Spec.ID, Writes: s.Writes, Reads: s.Reads, WriteErrors: s.WriteErrors, ReadErrors: s.ReadErrors,
		Mismatches: s.Mismatches, Undefined: s.Undefined, Stalls: len(s.Stalls), SlowestOp: s.MaxOp.Seconds(),
		Verifications: v.Verifications,
	}
	for _, f := range s.Findings {
		if strings.HasPrefix(f.Detail, workload.Mismatch.String()) && len(vr.Findings) < 50 {
			vr.Findings = append(vr.Findings, f)
		}
	}
	if in.Tracker != nil {
		vr.AllDown = clip(in.Tracker.AllDown[v.Spec.ID], in.Start, in.End)
		for _, rp := range in.Tracker.Replaced {
			if rp.Volume == v.Spec.ID {
				vr.Replaced = append(vr.Replaced, rp)
			}
		}
	}
	// The verifications' mismatches were counted by the worker already
	// (they go through its model); nothing to add.
	vr.ErrorWindows = errorWindows(in, v.Spec.ID, s.Errors)
	return vr
}

// clip keeps the parts of spans within [from, to]: the setup before the
// faults start (every volume is down until it is staged) and the final
// unstages are not the run's.
func clip(spans []observe.Span, from, to time.Time) []observe.Span {
	var out []observe.Span
	for _, sp := range spans {
		end := sp.To
		if end.IsZero() || end.After(to) {
			end = to
		}
		start := sp.From
		if start.Before(from) {
			start = from
		}
		if end.After(start) {
			out = append(out, observe.Span{From: start, To: end})
		}
	}
	return out
}

// errorWindows groups a volume's failed operations into stretches with
// no gap over 5 s, and names the faults active on the volume meanwhile.
func errorWindows(in Input, vol string, errs []workload.Event) []Window {
	const gap = 5 * time.Second
	var out []Window
	for _, e := range errs {
		end := e.At.Add(e.Took)
		if n := len(out); n > 0 && !e.At.After(out[n-1].To.Add(gap)) {
			out[n-1].To = later(out[n-1].To, end)
			out[n-1].Errors++
			continue
		}
		out = append(out, Window{From: e.At, To: end, Errors: 1, First: fmt.Sprintf("%s block %d: %s", e.Op, e.Block, e.Err)})
	}
	for i := range out {
		w := &out[i]
		for _, f := range in.Faults {
			if f.Result != "done" || !slices.Contains(f.Volumes, vol) {
				continue
			}
			end := f.Undone
			if end.IsZero() {
				end = f.Injected
			}
			end = end.Add(plan.Tail(f.Kind))
			if !f.Injected.IsZero() && !f.Injected.After(w.To) && !end.Before(w.From) {
				w.Faults = append(w.Faults, fmt.Sprintf("#%d %s", f.ID, f.Kind))
			}
		}
		if in.Tracker != nil {
			for _, sp := range in.Tracker.AllDown[vol] {
				if !sp.From.After(w.To) && (sp.To.IsZero() || !sp.To.Before(w.From)) {
					w.AllDown = true
				}
			}
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// teardowns: every controller or session the observer saw go away while
// its last sample showed it healthy, unless the soak removed it itself
// (a controller deleted by hand, an unstage that was the target's last
// volume). One whose path got a fault between that sample and the
// teardown cannot be judged from outside: it is listed apart.
func (r *Report) teardowns(in Input, heals []Heal) {
	if in.Tracker == nil {
		return
	}
	for _, g := range in.Tracker.Gone {
		if !g.Object.Healthy || bySoak(in, g) {
			continue
		}
		td := Teardown{Gone: g}
		for _, h := range heals {
			if slices.Contains(h.Names, g.Object.Name) && !h.At.Before(g.LastSeen.Add(-2*time.Second)) && !h.At.After(g.NotSeen.Add(5*time.Second)) {
				td.Verdict = fmt.Sprintf("%s %s %s: %s", h.At.Format("15:04:05.000"), h.Kind, h.Verdict, h.Reason)
			}
		}
		if faultBetween(in, g) {
			r.Unverifiable = append(r.Unverifiable, td)
			continue
		}
		r.Teardowns = append(r.Teardowns, td)
	}
}

// bySoak reports whether the soak removed the object itself.
func bySoak(in Input, g observe.Gone) bool {
	for _, f := range in.Faults {
		if slices.Contains(f.Objects, g.Object.Key) {
			return true
		}
	}
	for _, a := range in.Actions {
		if a.What != "unstage" || a.At.After(g.NotSeen) || (!a.End.IsZero() && a.End.Add(2*time.Second).Before(g.LastSeen)) {
			continue
		}
		// An unstage may take the target's paths only when no other
		// volume of the soak on that target was staged then.
		if lastOnTarget(in, a, g.Object.Target) {
			return true
		}
	}
	return false
}

// lastOnTarget: the unstaged volume is on target and no other volume of
// target was staged during the unstage.
func lastOnTarget(in Input, un Action, target string) bool {
	mine := false
	for _, v := range in.Volumes {
		if v.Target != target {
			continue
		}
		if v.Spec.ID == un.Volume {
			mine = true
			continue
		}
		if stagedDuring(in, v.Spec.ID, un.At) {
			return false
		}
	}
	return mine
}

// stagedDuring: the volume's last stage before at succeeded and no
// unstage of it ended between that stage and at.
func stagedDuring(in Input, vol string, at time.Time) bool {
	staged := false
	for _, a := range in.Actions {
		if a.Volume != vol || a.At.After(at) {
			continue
		}
		switch {
		case a.What == "stage" && a.Err == "":
			staged = true
		case a.What == "unstage" && a.Err == "":
			staged = false
		}
	}
	return staged
}

// faultBetween: a fault was put on the object's endpoint (or a volume
// fault on a volume of its target) between its last healthy sample and
// the sample that no longer had it.
func faultBetween(in Input, g observe.Gone) bool {
	for _, f := range in.Faults {
		if f.Injected.IsZero() || f.Injected.Before(g.LastSeen.Add(-time.Second)) || f.Injected.After(g.NotSeen) {
			continue
		}
		for _, v := range in.Volumes {
			if v.Target == g.Object.Target && slices.Contains(f.Volumes, v.Spec.ID) {
				return true
			}
		}
	}
	return false
}

// readOnly judges every read-only remount against the every-path-down
// spans of its volume: explained when one before it outlasted the
// queueing window.
func (r *Report) readOnly(in Input) {
	seen := map[string]bool{}
	for _, ro := range in.ReadOnly {
		if seen[ro.Volume] {
			continue // one per volume and incarnation is enough; the first decides
		}
		seen[ro.Volume] = true
		v := ReadOnlyVerdict{ReadOnly: ro}
		var win time.Duration
		for _, vol := range in.Volumes {
			if vol.Spec.ID == ro.Volume {
				win = vol.Window
			}
		}
		v.Window = win.Seconds()
		if in.Tracker != nil {
			for _, sp := range in.Tracker.AllDown[ro.Volume] {
				if sp.From.After(ro.At) {
					continue
				}
				v.AllDown = max(v.AllDown, sp.Len(ro.At).Seconds())
			}
		}
		v.Explained = win > 0 && v.AllDown >= win.Seconds()
		r.ReadOnly = append(r.ReadOnly, v)
	}
}

// bounced counts healthy sessions that left LOGGED_IN within 5 s after
// pathmend restarted iscsid: the cost of that rung on the other sessions.
func bounced(in Input) int {
	if in.Tracker == nil {
		return 0
	}
	var restarts []time.Time
	for _, h := range Heals(in.Log) {
		if h.Kind == "iscsi restart-iscsid" && h.Verdict == "repaired" {
			restarts = append(restarts, h.At)
		}
	}
	n := 0
	for _, tr := range in.Tracker.Transitions {
		if tr.Up || !strings.Contains(tr.Key, "/") {
			continue
		}
		for _, at := range restarts {
			if d := at.Sub(tr.At); d >= 0 && d <= 10*time.Second && strings.Contains(tr.Detail, "session") {
				n++
				break
			}
		}
	}
	return n
}

func (r *Report) failures(in Input) {
	if n := r.Checks.DataMismatches; n > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d data mismatches", n))
	}
	for _, td := range r.Teardowns {
		r.Failures = append(r.Failures, fmt.Sprintf("healthy %s %s (%s) torn down between %s and %s%s",
			td.Object.Name, td.Object.Endpoint, td.Object.Target, td.LastSeen.Format("15:04:05.000"), td.NotSeen.Format("15:04:05.000"), suffix(td.Verdict)))
	}
	for _, ro := range r.ReadOnly {
		if !ro.Explained {
			r.Failures = append(r.Failures, fmt.Sprintf("%s read-only at %s (%s) with every path down for at most %.0fs, within its %.0fs queueing window",
				ro.Volume, ro.At.Format("15:04:05.000"), ro.Source, ro.AllDown, ro.Window))
		}
	}
	for _, o := range in.Orphans {
		r.Failures = append(r.Failures, "orphaned at the end: "+o)
	}
	for _, e := range r.KernelCrashes {
		r.Failures = append(r.Failures, fmt.Sprintf("the kernel crashed at %s: %s", e.At.Format("15:04:05.000"), e.What))
	}
}

func suffix(v string) string {
	if v == "" {
		return ""
	}
	return "; pathmend: " + v
}

// timeline merges what happened, in time order.
func timeline(in Input, heals []Heal) []Event {
	var ev []Event
	add := func(at time.Time, f string, a ...any) {
		if !at.IsZero() {
			ev = append(ev, Event{At: at, What: fmt.Sprintf(f, a...)})
		}
	}
	for _, f := range in.Faults {
		switch f.Result {
		case "done":
			add(f.Injected, "fault %s injected", f.Fault)
			add(f.Undone, "fault #%d %s undone", f.ID, f.Kind)
		default:
			add(in.Start.Add(f.At), "fault %s %s: %s", f.Fault, f.Result, f.Note)
		}
	}
	for _, a := range in.Actions {
		s := a.What
		if a.Volume != "" {
			s += " " + a.Volume
		}
		if a.Err != "" {
			s += " failed: " + a.Err
		}
		if a.Note != "" {
			s += " (" + a.Note + ")"
		}
		add(a.At, "%s", s)
	}
	if in.Tracker != nil {
		for _, t := range in.Tracker.Transitions {
			state := "down"
			if t.Up {
				state = "up"
			}
			add(t.At, "path %s %s: %s", t.Key, state, t.Detail)
		}
		for _, g := range in.Tracker.Gone {
			h := "not healthy: " + g.Object.Why
			if g.Object.Healthy {
				h = "healthy"
			}
			add(g.NotSeen, "gone: %s %s %s %s (%s, last seen %s)", g.Object.Name, g.Object.Target, g.Object.Endpoint, g.Object.State, h, g.LastSeen.Format("15:04:05.000"))
		}
		for _, rp := range in.Tracker.Replaced {
			add(rp.At, "device of %s replaced: %s → %s", rp.Volume, rp.From, rp.To)
		}
	}
	for _, h := range heals {
		add(h.At, "pathmend: %s %s %s: %s", h.Kind, h.Verdict, strings.Join(h.Names, ","), h.Reason)
	}
	for _, ro := range in.ReadOnly {
		add(ro.At, "%s read-only (%s)", ro.Volume, ro.Source)
	}
	ev = append(ev, in.Kernel...)
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At.Before(ev[j].At) })
	return ev
}

// KernelCrash reports whether a kernel log line is an oops or a BUG.
func KernelCrash(msg string) bool {
	return strings.HasPrefix(msg, "BUG: ") || strings.HasPrefix(msg, "Oops: ") || strings.HasPrefix(msg, "kernel BUG at ")
}
