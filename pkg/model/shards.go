package model

import (
	"hash/maphash"
	"iter"
	"maps"
	"slices"
)

// shardCount is how many maps a snapshot's volumes are spread over. A
// write copies the one map of the volume it writes (1/64 of the node),
// not the node: the loop writes one target after every kernel event.
const shardCount = 64

var shardSeed = maphash.MakeSeed()

// shards is a snapshot's volumes by ID, spread over shardCount maps by a
// hash of the ID. Snapshots share the maps a write did not touch; a map
// once published is never written again.
type shards struct {
	m [shardCount]map[string]entry
	n int
}

func shardOf(id string) int { return int(maphash.String(shardSeed, id) % shardCount) }

func (s *shards) get(id string) (entry, bool) {
	e, ok := s.m[shardOf(id)][id]
	return e, ok
}

// ids returns every ID, sorted.
func (s *shards) ids() []string {
	out := make([]string, 0, s.n)
	for _, m := range s.m {
		for id := range m {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// all yields every entry, in no order.
func (s *shards) all() iter.Seq2[string, entry] {
	return func(yield func(string, entry) bool) {
		for _, m := range s.m {
			for id, e := range m {
				if !yield(id, e) {
					return
				}
			}
		}
	}
}

// writable is the set of a transaction's shards it copied: the maps it
// may write.
type writable [shardCount]bool

// set writes e under id in s, copying its map first unless w says the
// transaction already did.
func (s *shards) set(w *writable, id string, e entry) {
	i := shardOf(id)
	s.own(w, i)
	if _, ok := s.m[i][id]; !ok {
		s.n++
	}
	s.m[i][id] = e
}

// del drops id from s, copying its map first unless w says the
// transaction already did.
func (s *shards) del(w *writable, id string) {
	i := shardOf(id)
	if _, ok := s.m[i][id]; !ok {
		return
	}
	s.own(w, i)
	delete(s.m[i], id)
	s.n--
}

func (s *shards) own(w *writable, i int) {
	if w[i] {
		return
	}
	if s.m[i] == nil {
		s.m[i] = map[string]entry{}
	} else {
		s.m[i] = maps.Clone(s.m[i])
	}
	w[i] = true
}
