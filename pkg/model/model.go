package model

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Model is the node model. Build one per process and share it: the loop
// writes it, the driver, /healthz and the metrics read it. It is safe for
// concurrent use.
type Model struct {
	mu  sync.Mutex // serializes Update
	cur atomic.Pointer[Snapshot]
	seq atomic.Uint64
}

// New returns an empty model: generation 0, no volume, never ticked.
func New() *Model {
	m := &Model{}
	m.cur.Store(&Snapshot{node: map[string][]volume.Condition{}, ix: &index{}})
	return m
}

// Snapshot returns the current snapshot: one atomic load, never blocked
// by a writer.
func (m *Model) Snapshot() *Snapshot { return m.cur.Load() }

// Stamp is taken before a read of the kernel and written with what the
// read found: of two writes of one entry, the one whose read began later
// wins, whatever order they commit in.
type Stamp struct {
	seq uint64
	// At is when the read began: the ReadAt of what it writes.
	At time.Time
}

// Newer reports whether s was taken after o.
func (s Stamp) Newer(o Stamp) bool { return s.seq > o.seq }

// Stamp returns a stamp for a read that begins at at (the caller's
// clock).
func (m *Model) Stamp(at time.Time) Stamp { return Stamp{seq: m.seq.Add(1), At: at} }

// Update runs fn as one transaction and publishes its result: a new
// Snapshot with the next generation when fn changed anything. Updates are
// serialized; readers are never blocked. fn must not call Update.
func (m *Model) Update(fn func(*Txn)) *Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.cur.Load()
	tx := &Txn{old: old, gen: old.Gen + 1}
	fn(tx)
	if tx.next == nil {
		return old
	}
	m.cur.Store(tx.next)
	return tx.next
}

// Refresher reads the kernel objects of one target only (one NVMe
// subsystem with its controllers and heads, one iSCSI target's sessions
// with their LUNs and maps) and writes what it read of that target's
// volumes into the model. The loop implements it (pkg/monitor); a kernel
// event names the object, Snapshot.TargetOf its target.
type Refresher interface {
	RefreshTarget(ctx context.Context, t volume.Target) error
}

// Txn is one write of the model. Its methods apply to the snapshot being
// built; nothing is visible to readers before Update returns.
type Txn struct {
	old  *Snapshot
	next *Snapshot // nil until the first change
	gen  uint64
	// reindexed is set once next has an index of its own: a change
	// that added, dropped or renamed a volume's target or objects.
	reindexed bool
	// own are the shards of next's volumes the transaction copied.
	own writable
}

// snap returns the snapshot being built, copying the old one on the
// first change.
func (tx *Txn) snap() *Snapshot {
	if tx.next == nil {
		o := tx.old
		tx.next = &Snapshot{Gen: tx.gen, Ticked: o.Ticked, ReadAt: o.ReadAt,
			volumes: o.volumes, node: maps.Clone(o.node), ix: o.ix}
	}
	return tx.next
}

// reindex gives the snapshot being built an index of its own, built on
// first use: its volumes no longer name what the old one's do.
func (tx *Txn) reindex() {
	if !tx.reindexed {
		tx.snap().ix = &index{}
		tx.reindexed = true
	}
}

// current is the snapshot as the transaction has it so far.
func (tx *Txn) current() *Snapshot {
	if tx.next != nil {
		return tx.next
	}
	return tx.old
}

// Get returns the entry of id as the transaction has it so far.
func (tx *Txn) Get(id string) (Volume, bool) { return tx.current().Volume(id) }

// Put writes what a read stamped st found of volume v (ID, Target, Scope,
// Paths without Since, Devices, Held, Condition, Notes) and reports
// whether it did: an entry a read stamped later wrote is kept. The facts
// of the entry are kept unless v carries Facts. Path.Since is carried
// over from the entry for every path in the same state with the same
// object, and is st.At for the others. Put takes ownership of v's slices.
func (tx *Txn) Put(st Stamp, v Volume) bool {
	old, had := tx.current().volumes.get(v.ID)
	if had && old.st.Newer(st) {
		return false
	}
	if v.Facts == nil && had {
		v.Facts = old.v.Facts
	}
	// A steady read hands back the entry's own paths (the transport
	// builds nothing for a volume that did not change): they carry their
	// Since already, and are the entry's, not to be written.
	if !had || !samePathSlice(old.v.Paths, v.Paths) {
		for i := range v.Paths {
			p := &v.Paths[i]
			p.Since = st.At
			if had {
				for _, q := range old.v.Paths {
					if q.Endpoint == p.Endpoint && q.State == p.State && q.Object == p.Object {
						p.Since = q.Since
						break
					}
				}
			}
		}
	}
	v.ReadAt, v.Gen = time.Time{}, 0
	s := tx.snap()
	if !had || old.v.Target != v.Target || !sameObjects(old.v, &v) {
		tx.reindex()
	}
	if had && sameContent(old.v, &v) && sameFacts(old.v.Facts, v.Facts) {
		s.volumes.set(&tx.own, v.ID, entry{v: old.v, st: st})
		return true
	}
	nv := new(Volume)
	*nv = v
	nv.Gen = tx.gen
	s.volumes.set(&tx.own, v.ID, entry{v: nv, st: st})
	return true
}

// Delete drops the entry of id, with its facts.
func (tx *Txn) Delete(id string) {
	if _, ok := tx.current().volumes.get(id); ok {
		tx.snap().volumes.del(&tx.own, id)
		tx.reindex()
	}
}

// Sweep drops, after a full read stamped st, every entry read before st
// for which keep returns false: the volumes that read no longer found (an
// unstaged volume, a forgotten learned target). An entry a later read
// wrote is kept whatever keep says.
func (tx *Txn) Sweep(st Stamp, keep func(Volume) bool) {
	var drop []string
	for id, e := range tx.current().volumes.all() {
		if !st.Newer(e.st) {
			continue
		}
		if !keep(e.view()) {
			drop = append(drop, id)
		}
	}
	if len(drop) == 0 {
		return
	}
	s := tx.snap()
	for _, id := range drop {
		s.volumes.del(&tx.own, id)
	}
	tx.reindex()
}

// SetFact sets the fact of volume id kept under name; it reports false,
// and sets nothing, when the model has no entry of id.
func (tx *Txn) SetFact(id, name string, f Fact) bool {
	e, ok := tx.current().volumes.get(id)
	if !ok {
		return false
	}
	if cur, ok := e.v.Facts[name]; ok && cur.ReadAt.Equal(f.ReadAt) && sameCondition(cur.Condition, f.Condition) {
		return true
	}
	v := *e.v
	v.Facts = maps.Clone(v.Facts)
	if v.Facts == nil {
		v.Facts = map[string]Fact{}
	}
	v.Facts[name] = f
	v.Gen = tx.gen
	tx.snap().volumes.set(&tx.own, id, entry{v: &v, st: e.st})
	return true
}

// ClearFact drops the fact of volume id kept under name.
func (tx *Txn) ClearFact(id, name string) {
	e, ok := tx.current().volumes.get(id)
	if !ok {
		return
	}
	if _, ok := e.v.Facts[name]; !ok {
		return
	}
	v := *e.v
	v.Facts = maps.Clone(v.Facts)
	delete(v.Facts, name)
	v.Gen = tx.gen
	tx.snap().volumes.set(&tx.own, id, entry{v: &v, st: e.st})
}

// SetNode sets the node's conditions kept under source (the NVMe and the
// iSCSI transport each keep theirs); none drops them.
func (tx *Txn) SetNode(source string, conds []volume.Condition) {
	cur, ok := tx.current().node[source]
	if ok && slices.EqualFunc(cur, conds, sameCondition) || !ok && len(conds) == 0 {
		return
	}
	s := tx.snap()
	if len(conds) == 0 {
		delete(s.node, source)
		return
	}
	s.node[source] = slices.Clone(conds)
}

// Ticked records the end of a tick whose full read began at readAt.
func (tx *Txn) Ticked(end, readAt time.Time) {
	s := tx.snap()
	s.Ticked, s.ReadAt = end, readAt
}

func sameFacts(a, b map[string]Fact) bool {
	return maps.EqualFunc(a, b, func(x, y Fact) bool { return x.ReadAt.Equal(y.ReadAt) && sameCondition(x.Condition, y.Condition) })
}

// samePathSlice reports whether a and b are the same slice (one backing
// array, one length): a volume's paths handed back as the entry has them.
func samePathSlice(a, b []Path) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}
