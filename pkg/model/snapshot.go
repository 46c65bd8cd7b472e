package model

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Snapshot is the model at one generation. Nothing in it changes after
// Model.Update published it; its methods are safe for concurrent use.
type Snapshot struct {
	// Gen is the generation: 0 for an empty model, one more with every
	// Update that changed something.
	Gen uint64
	// Ticked is the end of the last tick; zero before the first.
	Ticked time.Time
	// ReadAt is when the last tick's full read began.
	ReadAt time.Time

	volumes map[string]entry
	node    map[string][]volume.Condition

	// The lookups by target and by kernel object are built on first use:
	// only readers that ask pay for them.
	indexOnce sync.Once
	byTarget  map[volume.Target][]string
	objects   map[string]volume.Target
}

// entry is a volume as stored: its state, shared between snapshots while
// it does not change, and the stamp of the read that last wrote it.
type entry struct {
	v  *Volume
	st Stamp
}

// view is the entry as readers get it, with its read time.
func (e entry) view() Volume {
	v := *e.v
	v.ReadAt = e.st.At
	return v
}

// Len is the number of volumes.
func (s *Snapshot) Len() int { return len(s.volumes) }

// Volume returns the entry of id.
func (s *Snapshot) Volume(id string) (Volume, bool) {
	e, ok := s.volumes[id]
	if !ok {
		return Volume{}, false
	}
	return e.view(), true
}

// Fresh returns the entry of id when its read is at most bound old at
// now; ok is false when it is older, or missing.
func (s *Snapshot) Fresh(id string, now time.Time, bound time.Duration) (Volume, bool) {
	v, ok := s.Volume(id)
	if !ok || v.Age(now) > bound {
		return Volume{}, false
	}
	return v, true
}

// Volumes returns every entry, by ID.
func (s *Snapshot) Volumes() []Volume {
	out := make([]Volume, 0, len(s.volumes))
	for _, id := range slices.Sorted(maps.Keys(s.volumes)) {
		out = append(out, s.volumes[id].view())
	}
	return out
}

// OfTarget returns the entries of target t, by ID.
func (s *Snapshot) OfTarget(t volume.Target) []Volume {
	s.index()
	ids := s.byTarget[t]
	out := make([]Volume, 0, len(ids))
	for _, id := range ids {
		out = append(out, s.volumes[id].view())
	}
	return out
}

// TargetOf returns the target a kernel object serves: a controller, a
// session, a block device any entry names, or a target's own name.
func (s *Snapshot) TargetOf(object string) (volume.Target, bool) {
	s.index()
	t, ok := s.objects[object]
	return t, ok
}

// Node returns the node's conditions: every source's, by source name.
func (s *Snapshot) Node() []volume.Condition {
	var out []volume.Condition
	for _, src := range slices.Sorted(maps.Keys(s.node)) {
		out = append(out, s.node[src]...)
	}
	return out
}

// NodeOf returns the node's conditions kept under source.
func (s *Snapshot) NodeOf(source string) []volume.Condition { return s.node[source] }

func (s *Snapshot) index() {
	s.indexOnce.Do(func() {
		s.byTarget = map[volume.Target][]string{}
		s.objects = map[string]volume.Target{}
		for _, id := range slices.Sorted(maps.Keys(s.volumes)) {
			v := s.volumes[id].v
			s.byTarget[v.Target] = append(s.byTarget[v.Target], id)
			s.objects[v.Target.Name] = v.Target
			for _, o := range v.objects() {
				s.objects[o] = v.Target
			}
		}
	})
}

// String summarizes the snapshot for logs: "gen 12, 3 volumes".
func (s *Snapshot) String() string {
	return "gen " + strconv.FormatUint(s.Gen, 10) + ", " + strconv.Itoa(len(s.volumes)) + " volumes"
}
