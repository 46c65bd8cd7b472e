package observe

import (
	"sort"
	"time"
)

// Span is a closed stretch of time [From, To]; To is zero while it lasts.
type Span struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to,omitzero"`
}

// Len is the span's length, up to until while it lasts.
func (s Span) Len(until time.Time) time.Duration {
	if s.To.IsZero() {
		return until.Sub(s.From)
	}
	return s.To.Sub(s.From)
}

// Contains reports whether t falls in the span (an open span lasts).
func (s Span) Contains(t time.Time) bool {
	return !t.Before(s.From) && (s.To.IsZero() || !t.After(s.To))
}

// Gone is a controller or session that was seen and then was not.
type Gone struct {
	Object Object `json:"object"`
	// LastSeen is the last sample that had it; NotSeen the first that
	// did not.
	LastSeen time.Time `json:"lastSeen"`
	NotSeen  time.Time `json:"notSeen"`
}

// Replaced is a volume whose block device changed.
type Replaced struct {
	Volume string    `json:"volume"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	At     time.Time `json:"at"`
}

// Transition is a path or a whole volume changing between up and down.
type Transition struct {
	At     time.Time `json:"at"`
	Key    string    `json:"key"` // "volume/path", or "volume" for all its paths
	Up     bool      `json:"up"`
	Detail string    `json:"detail,omitempty"`
}

// Tracker turns samples into spans and events. Samples must come in time
// order; a sample with Err is skipped. Not safe for concurrent use.
type Tracker struct {
	vols []VolumeSpec

	last    Sample
	started bool
	// device is each volume's last block device seen, kept through
	// samples where it has none, so a replacement through a gap (old
	// gone, later a new one) is seen.
	device map[string]string
	// pathDown and allDown are the spans a path, a volume's every path,
	// was down; Transitions every change, in order.
	PathDown    map[string][]Span
	AllDown     map[string][]Span
	Transitions []Transition
	Gone        []Gone
	Replaced    []Replaced
	// Samples counts the samples taken in.
	Samples int
	// MaxGap is the longest time between two samples taken in.
	MaxGap time.Duration
}

// NewTracker tracks the volumes vols.
func NewTracker(vols []VolumeSpec) *Tracker {
	return &Tracker{vols: vols, device: map[string]string{}, PathDown: map[string][]Span{}, AllDown: map[string][]Span{}}
}

// Add takes in one sample.
func (t *Tracker) Add(s Sample) {
	if s.Err != nil {
		return
	}
	t.Samples++
	if t.started {
		t.MaxGap = max(t.MaxGap, s.At.Sub(t.last.At))
	}
	for _, v := range t.vols {
		up := 0
		for _, p := range v.Paths {
			k := PathKey(v.ID, p.ID)
			now := s.Paths[k]
			was, seen := t.last.Paths[k]
			if !t.started || !seen || was.Up != now.Up {
				t.Transitions = append(t.Transitions, Transition{At: s.At, Key: k, Up: now.Up, Detail: now.Detail})
				t.PathDown[k] = flip(t.PathDown[k], now.Up, s.At)
			}
			if now.Up {
				up++
			}
		}
		allDown := up == 0
		spans := t.AllDown[v.ID]
		open := len(spans) > 0 && spans[len(spans)-1].To.IsZero()
		switch {
		case allDown && !open:
			t.AllDown[v.ID] = append(spans, Span{From: s.At})
			t.Transitions = append(t.Transitions, Transition{At: s.At, Key: v.ID, Up: false, Detail: "every path down"})
		case !allDown && open:
			spans[len(spans)-1].To = s.At
			t.Transitions = append(t.Transitions, Transition{At: s.At, Key: v.ID, Up: true, Detail: "a path is back"})
		}
		if to := s.Devices[v.ID]; to != "" {
			if from := t.device[v.ID]; from != "" && from != to {
				t.Replaced = append(t.Replaced, Replaced{Volume: v.ID, From: from, To: to, At: s.At})
			}
			t.device[v.ID] = to
		}
	}
	if t.started {
		for k, o := range t.last.Objects {
			if _, ok := s.Objects[k]; !ok {
				t.Gone = append(t.Gone, Gone{Object: o, LastSeen: t.last.At, NotSeen: s.At})
			}
		}
		sort.SliceStable(t.Gone, func(i, j int) bool { return t.Gone[i].NotSeen.Before(t.Gone[j].NotSeen) })
	}
	t.last, t.started = s, true
}

// flip opens a down span when a path goes down, closes it when it comes up.
func flip(spans []Span, up bool, at time.Time) []Span {
	open := len(spans) > 0 && spans[len(spans)-1].To.IsZero()
	switch {
	case !up && !open:
		return append(spans, Span{From: at})
	case up && open:
		spans[len(spans)-1].To = at
	}
	return spans
}

// AllUpAt returns the first sample time at or after at at which every
// path of volume was up, and whether there was one.
func (t *Tracker) AllUpAt(volume string, at time.Time) (time.Time, bool) {
	var v *VolumeSpec
	for i := range t.vols {
		if t.vols[i].ID == volume {
			v = &t.vols[i]
		}
	}
	if v == nil {
		return time.Time{}, false
	}
	up := map[string]bool{}
	allUp := func() bool {
		for _, p := range v.Paths {
			if !up[PathKey(volume, p.ID)] {
				return false
			}
		}
		return true
	}
	checked := false
	for _, tr := range t.Transitions {
		if tr.At.After(at) && !checked {
			if allUp() {
				return at, true
			}
			checked = true
		}
		if _, mine := up[tr.Key]; !mine && !t.pathOf(v, tr.Key) {
			continue
		}
		up[tr.Key] = tr.Up
		if checked && allUp() {
			return tr.At, true
		}
	}
	if !checked && allUp() {
		return at, true
	}
	return time.Time{}, false
}

func (t *Tracker) pathOf(v *VolumeSpec, key string) bool {
	for _, p := range v.Paths {
		if PathKey(v.ID, p.ID) == key {
			return true
		}
	}
	return false
}

// DownAt returns the all-paths-down span of volume that contains at.
func (t *Tracker) DownAt(volume string, at time.Time) (Span, bool) {
	for _, s := range t.AllDown[volume] {
		if s.Contains(at) {
			return s, true
		}
	}
	return Span{}, false
}

// Last is the latest sample taken in.
func (t *Tracker) Last() Sample { return t.last }
