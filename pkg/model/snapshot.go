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

	volumes shards
	node    map[string][]volume.Condition

	// The lookups by target and by kernel object, built on first use:
	// only readers that ask pay for them. A snapshot whose volumes name
	// the same targets and objects as the one it was written from shares
	// its index (Txn.Put), so that the loop's writes between ticks (an
	// event's read of one target, which mostly finds what the model has)
	// do not rebuild it for the whole node.
	ix *index
}

// index is the lookups of one set of volumes, by target and by kernel
// object. Snapshots share one while their volumes' IDs, targets and
// objects are the same: whichever builds it builds the same maps.
type index struct {
	once     sync.Once
	byTarget map[volume.Target][]string
	objects  map[string]volume.Target
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
func (s *Snapshot) Len() int { return s.volumes.n }

// Volume returns the entry of id.
func (s *Snapshot) Volume(id string) (Volume, bool) {
	e, ok := s.volumes.get(id)
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
	out := make([]Volume, 0, s.volumes.n)
	for _, id := range s.volumes.ids() {
		e, _ := s.volumes.get(id)
		out = append(out, e.view())
	}
	return out
}

// OfTarget returns the entries of target t, by ID.
func (s *Snapshot) OfTarget(t volume.Target) []Volume {
	ids := s.index().byTarget[t]
	out := make([]Volume, 0, len(ids))
	for _, id := range ids {
		e, _ := s.volumes.get(id)
		out = append(out, e.view())
	}
	return out
}

// TargetOf returns the target a kernel object serves: a controller, a
// session, a block device any entry names, or a target's own name.
func (s *Snapshot) TargetOf(object string) (volume.Target, bool) {
	t, ok := s.index().objects[object]
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

func (s *Snapshot) index() *index {
	ix := s.ix
	ix.once.Do(func() {
		ix.byTarget = map[volume.Target][]string{}
		ix.objects = map[string]volume.Target{}
		for _, id := range s.volumes.ids() {
			e, _ := s.volumes.get(id)
			v := e.v
			ix.byTarget[v.Target] = append(ix.byTarget[v.Target], id)
			ix.objects[v.Target.Name] = v.Target
			for _, o := range v.objects() {
				ix.objects[o] = v.Target
			}
		}
	})
	return ix
}

// String summarizes the snapshot for logs: "gen 12, 3 volumes".
func (s *Snapshot) String() string {
	return "gen " + strconv.FormatUint(s.Gen, 10) + ", " + strconv.Itoa(s.volumes.n) + " volumes"
}
