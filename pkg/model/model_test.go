package model_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/volume"
)

var (
	t0   = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tgtA = volume.Target{Transport: volume.TransportNVMeTCP, Name: "nqn.2014-08.io.example:a"}
	tgtI = volume.Target{Transport: volume.TransportISCSI, Name: "iqn.2024-01.io.example:t"}
)

func vol(id string, t volume.Target, states ...model.PathState) model.Volume {
	v := model.Volume{ID: id, Target: t, Scope: model.Owned}
	live := 0
	for i, st := range states {
		p := model.Path{Endpoint: "127.0.0.1:442" + string(rune('0'+i)), State: st}
		if st != model.PathAbsent {
			p.Object = "nvme" + string(rune('0'+i))
		}
		if st == model.PathLive {
			live++
			p.Optimized = i == 0
		}
		v.Paths = append(v.Paths, p)
	}
	switch {
	case live == len(states):
		v.Condition = volume.Condition{Status: volume.Healthy, Message: "all live"}
	case live > 0:
		v.Condition = volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: "some live"}
	default:
		v.Condition = volume.Condition{Status: volume.Inaccessible, Reason: "NoLivePath", Message: "none live"}
	}
	return v
}

func put(m *model.Model, at time.Time, vs ...model.Volume) *model.Snapshot {
	st := m.Stamp(at)
	return m.Update(func(tx *model.Txn) {
		for _, v := range vs {
			tx.Put(st, v)
		}
	})
}

func TestModel_EmptyModelHasNothingAndNeverTicked(t *testing.T) {
	s := model.New().Snapshot()
	if s.Gen != 0 || s.Len() != 0 || !s.Ticked.IsZero() || len(s.Node()) != 0 {
		t.Fatalf("empty model: %v, ticked %v, node %v", s, s.Ticked, s.Node())
	}
	if _, ok := s.Volume("x"); ok {
		t.Fatal("an empty model has a volume")
	}
}

// TestModel_SinceIsKeptWhileAPathStaysInItsState: the model measures how
// long a path has been in its state, since the kernel publishes no time
// of a state change.
func TestModel_SinceIsKeptWhileAPathStaysInItsState(t *testing.T) {
	m := model.New()
	put(m, t0, vol("v", tgtA, model.PathLive, model.PathLive))
	put(m, t0.Add(3*time.Second), vol("v", tgtA, model.PathLive, model.PathDown))
	s := put(m, t0.Add(6*time.Second), vol("v", tgtA, model.PathLive, model.PathDown))
	v, _ := s.Volume("v")
	if !v.Paths[0].Since.Equal(t0) || !v.Paths[1].Since.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("since = %v, %v; want %v and %v", v.Paths[0].Since, v.Paths[1].Since, t0, t0.Add(3*time.Second))
	}
	if !v.ReadAt.Equal(t0.Add(6 * time.Second)) {
		t.Errorf("read at %v", v.ReadAt)
	}
	// Another object in the same state is another path instance.
	w := vol("v", tgtA, model.PathLive, model.PathDown)
	w.Paths[1].Object = "nvme9"
	s = put(m, t0.Add(9*time.Second), w)
	v, _ = s.Volume("v")
	if !v.Paths[1].Since.Equal(t0.Add(9 * time.Second)) {
		t.Errorf("since of a new object = %v", v.Paths[1].Since)
	}
}

// TestModel_AnOlderReadNeverReplacesANewerOne: a targeted refresh that
// began after a tick's long read commits first; the tick's commit does
// not overwrite it, and its sweep does not drop it.
func TestModel_AnOlderReadNeverReplacesANewerOne(t *testing.T) {
	m := model.New()
	tick := m.Stamp(t0)
	refresh := m.Stamp(t0.Add(time.Second))
	m.Update(func(tx *model.Txn) {
		if !tx.Put(refresh, vol("v", tgtA, model.PathLive, model.PathDown)) {
			t.Error("the refresh was not written")
		}
		if !tx.Put(refresh, vol("new", tgtA, model.PathLive)) {
			t.Error("the refresh of a new volume was not written")
		}
	})
	s := m.Update(func(tx *model.Txn) {
		if tx.Put(tick, vol("v", tgtA, model.PathLive, model.PathLive)) {
			t.Error("the older read replaced the newer")
		}
		tx.Sweep(tick, func(v model.Volume) bool { return v.ID == "v" })
	})
	v, ok := s.Volume("v")
	if !ok || v.Paths[1].State != model.PathDown || !v.ReadAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("entry = %+v, want the refresh's", v)
	}
	if _, ok := s.Volume("new"); !ok {
		t.Error("the sweep dropped an entry a newer read wrote")
	}
}

// TestModel_SweepDropsWhatAFullReadNoLongerFound: an unstaged volume
// leaves the model with the next tick.
func TestModel_SweepDropsWhatAFullReadNoLongerFound(t *testing.T) {
	m := model.New()
	put(m, t0, vol("a", tgtA, model.PathLive), vol("b", tgtA, model.PathLive))
	st := m.Stamp(t0.Add(3 * time.Second))
	s := m.Update(func(tx *model.Txn) {
		tx.Put(st, vol("a", tgtA, model.PathLive))
		tx.Sweep(st, func(model.Volume) bool { return false })
	})
	if _, ok := s.Volume("b"); ok || s.Len() != 1 {
		t.Fatalf("after the sweep: %v", s.Volumes())
	}
}

// TestModel_FactsAreKeptAcrossReadsAndReportedAfterThePaths: another
// package's condition of a volume survives the loop's writes and is
// reported as an entry of its own.
func TestModel_FactsAreKeptAcrossReadsAndReportedAfterThePaths(t *testing.T) {
	m := model.New()
	put(m, t0, vol("v", tgtA, model.PathLive, model.PathDown))
	fs := volume.Condition{Status: volume.Inaccessible, Reason: "FilesystemReadOnly", Message: "remounted read-only"}
	m.Update(func(tx *model.Txn) {
		if !tx.SetFact("v", "filesystem", model.Fact{Condition: fs, ReadAt: t0}) {
			t.Error("fact not set")
		}
		if tx.SetFact("missing", "filesystem", model.Fact{Condition: fs, ReadAt: t0}) {
			t.Error("a fact of a volume the model does not have was set")
		}
	})
	s := put(m, t0.Add(3*time.Second), vol("v", tgtA, model.PathLive, model.PathDown))
	v, _ := s.Volume("v")
	want := []volume.Condition{{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: "some live"}, fs}
	if diff := cmp.Diff(want, v.Conditions()); diff != "" {
		t.Fatalf("conditions (-want +got):\n%s", diff)
	}
	s = m.Update(func(tx *model.Txn) { tx.ClearFact("v", "filesystem") })
	v, _ = s.Volume("v")
	if len(v.Facts) != 0 || len(v.Conditions()) != 1 {
		t.Errorf("after ClearFact: facts %v, conditions %v", v.Facts, v.Conditions())
	}
}

// TestVolume_AReplacedDeviceIsTheOneConditionItsFilesystemFactsAreToldIn:
// the filesystem on a device the kernel removed fails because it is gone
// (the lab: ext4 remounted it read-only while the volume was reported
// replaced); the volume has one condition, the cause, and the fact's
// reason and message are in it.
func TestVolume_AReplacedDeviceIsTheOneConditionItsFilesystemFactsAreToldIn(t *testing.T) {
	v := vol("v", tgtA, model.PathLive)
	v.Condition = volume.Condition{Status: volume.Inaccessible, Reason: volume.ReasonStagedDeviceReplaced, Message: "held by the staging mount is on sda (8:0)"}
	v.Facts = map[string]model.Fact{"filesystem": {Condition: volume.Condition{Status: volume.Inaccessible, Reason: "FilesystemReadOnly", Message: "ext4 on sda remounted read-only"}, ReadAt: t0}}
	want := []volume.Condition{{Status: volume.Inaccessible, Reason: volume.ReasonStagedDeviceReplaced,
		Message: "held by the staging mount is on sda (8:0); on the removed device, FilesystemReadOnly: ext4 on sda remounted read-only"}}
	if diff := cmp.Diff(want, v.Conditions()); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	// Any other condition keeps the fact as an entry of its own.
	v.Condition = volume.Condition{Status: volume.Degraded, Reason: "PathsBelowExpected", Message: "some live"}
	if got := v.Conditions(); len(got) != 2 || got[1].Reason != "FilesystemReadOnly" {
		t.Errorf("conditions of a degraded volume with a read-only filesystem: %v", got)
	}
}

func TestVolume_NotesFollowAnAbnormalConditionOnly(t *testing.T) {
	v := vol("v", tgtA, model.PathLive, model.PathAbsent)
	v.Notes = []string{"ControllerNotContributing repair deferred: grace: nvme4 is 2s old, 3s left"}
	if got := v.Conditions()[0].Message; got != "some live; ControllerNotContributing repair deferred: grace: nvme4 is 2s old, 3s left" {
		t.Errorf("message = %q", got)
	}
	h := vol("h", tgtA, model.PathLive)
	h.Notes = []string{"reconnect 127.0.0.1:4421: backed off"}
	if got := h.Conditions(); len(got) != 0 {
		t.Errorf("healthy volume with notes: %v", got)
	}
	if live, opt := v.Live(); live != 1 || opt != 1 {
		t.Errorf("live %d optimized %d", live, opt)
	}
}

// TestModel_UnchangedEntriesKeepTheirGeneration: a tick that finds
// nothing new changes only the read times.
func TestModel_UnchangedEntriesKeepTheirGeneration(t *testing.T) {
	m := model.New()
	s1 := put(m, t0, vol("a", tgtA, model.PathLive), vol("b", tgtA, model.PathLive))
	s2 := put(m, t0.Add(3*time.Second), vol("a", tgtA, model.PathLive), vol("b", tgtA, model.PathDown))
	a, _ := s2.Volume("a")
	b, _ := s2.Volume("b")
	if a.Gen != s1.Gen || b.Gen != s2.Gen || s2.Gen != s1.Gen+1 {
		t.Fatalf("gens: snapshot %d→%d, a %d, b %d", s1.Gen, s2.Gen, a.Gen, b.Gen)
	}
	if s3 := m.Update(func(*model.Txn) {}); s3 != s2 {
		t.Error("an empty update published a snapshot")
	}
}

func TestSnapshot_TargetOfNamesTheTargetOfEveryObject(t *testing.T) {
	m := model.New()
	v := vol("v", tgtA, model.PathLive, model.PathDown)
	v.Devices = []volume.BlockDevice{{Name: "nvme1n1", Number: volume.DeviceNumber{Major: 259, Minor: 3}}}
	i := model.Volume{ID: "i", Target: tgtI, Scope: model.Owned, Paths: []model.Path{{Endpoint: "127.0.0.1:3260", Object: "session5", State: model.PathLive}}}
	s := put(m, t0, v, i)
	for obj, want := range map[string]volume.Target{"nvme0": tgtA, "nvme1": tgtA, "nvme1n1": tgtA, tgtA.Name: tgtA, "session5": tgtI, tgtI.Name: tgtI} {
		if got, ok := s.TargetOf(obj); !ok || got != want {
			t.Errorf("TargetOf(%s) = %v, %v; want %v", obj, got, ok, want)
		}
	}
	if _, ok := s.TargetOf("nvme7"); ok {
		t.Error("an unknown object has a target")
	}
	if got := s.OfTarget(tgtI); len(got) != 1 || got[0].ID != "i" {
		t.Errorf("OfTarget = %v", got)
	}
}

func TestSnapshot_FreshHonoursTheBound(t *testing.T) {
	m := model.New()
	s := put(m, t0, vol("v", tgtA, model.PathLive))
	if _, ok := s.Fresh("v", t0.Add(6*time.Second), 6*time.Second); !ok {
		t.Error("an entry as old as the bound is not fresh")
	}
	if _, ok := s.Fresh("v", t0.Add(6*time.Second+1), 6*time.Second); ok {
		t.Error("an entry older than the bound is fresh")
	}
	if _, ok := s.Fresh("w", t0, time.Hour); ok {
		t.Error("a missing entry is fresh")
	}
}

func TestModel_NodeConditionsPerSource(t *testing.T) {
	m := model.New()
	nv := volume.Condition{Status: volume.Degraded, Reason: "EndpointsUnreachable", Message: "nvme"}
	is := volume.Condition{Status: volume.Inaccessible, Reason: "TargetUnreachable", Message: "iscsi"}
	s := m.Update(func(tx *model.Txn) {
		tx.SetNode("nvme-tcp", []volume.Condition{nv})
		tx.SetNode("iscsi", []volume.Condition{is})
		tx.Ticked(t0.Add(time.Second), t0)
	})
	if diff := cmp.Diff([]volume.Condition{is, nv}, s.Node()); diff != "" {
		t.Errorf("node (-want +got):\n%s", diff)
	}
	if !s.Ticked.Equal(t0.Add(time.Second)) || !s.ReadAt.Equal(t0) {
		t.Errorf("ticked %v read %v", s.Ticked, s.ReadAt)
	}
	s = m.Update(func(tx *model.Txn) { tx.SetNode("iscsi", nil) })
	if diff := cmp.Diff([]volume.Condition{nv}, s.Node()); diff != "" {
		t.Errorf("node after clearing iscsi (-want +got):\n%s", diff)
	}
}

// TestModel_ReadersNeverSeeAHalfWrittenTick: a reader racing a writer
// sees every volume of one write or none of it.
func TestModel_ReadersNeverSeeAHalfWrittenTick(t *testing.T) {
	m := model.New()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := m.Snapshot()
			vs := s.Volumes()
			for _, v := range vs {
				if v.Gen != vs[0].Gen && s.Gen > 0 {
					// every tick below rewrites both volumes
					t.Errorf("snapshot %d mixes generations %d and %d", s.Gen, vs[0].Gen, v.Gen)
					return
				}
			}
		}
	}()
	for i := range 200 {
		st := model.PathLive
		if i%2 == 1 {
			st = model.PathDown
		}
		put(m, t0.Add(time.Duration(i)*time.Second), vol("a", tgtA, st), vol("b", tgtA, st))
	}
	close(stop)
	wg.Wait()
}

// Every snapshot answers TargetOf and OfTarget for its own volumes,
// whether it shares its index with the snapshot it was written from (an
// unchanged target, a path that changed state on the same object, a
// fact) or needed one of its own (an object gone or new, a volume added
// or deleted, a sweep) — and whichever of two snapshots asks first.
func TestSnapshot_LookupsFollowEveryWrite(t *testing.T) {
	m := model.New()
	check := func(s *model.Snapshot, step string) {
		t.Helper()
		want := map[string]volume.Target{}
		byTarget := map[volume.Target][]string{}
		for _, v := range s.Volumes() {
			want[v.Target.Name] = v.Target
			byTarget[v.Target] = append(byTarget[v.Target], v.ID)
			for _, p := range v.Paths {
				if p.Object != "" {
					want[p.Object] = v.Target
				}
			}
			for _, d := range v.Devices {
				want[d.Name] = v.Target
			}
		}
		for _, obj := range []string{"nvme0", "nvme1", "nvme2", "nvme9", "nvme1n1", "nvme2n1", "session5", tgtA.Name, tgtI.Name} {
			got, ok := s.TargetOf(obj)
			if w, has := want[obj]; ok != has || got != w {
				t.Errorf("%s: TargetOf(%s) = %v, %v; want %v, %v", step, obj, got, ok, w, has)
			}
		}
		for _, tg := range []volume.Target{tgtA, tgtI} {
			var ids []string
			for _, v := range s.OfTarget(tg) {
				ids = append(ids, v.ID)
			}
			if d := cmp.Diff(byTarget[tg], ids); d != "" {
				t.Errorf("%s: OfTarget(%v) (-want +got):\n%s", step, tg, d)
			}
		}
	}
	a := vol("a", tgtA, model.PathLive, model.PathLive)
	a.Devices = []volume.BlockDevice{{Name: "nvme1n1"}}
	s1 := put(m, t0, a)
	check(s1, "first")
	s2 := put(m, t0.Add(time.Second), a) // the same read again
	check(s2, "unchanged")
	down := vol("a", tgtA, model.PathLive, model.PathDown) // same objects, another state
	down.Devices = a.Devices
	s3 := put(m, t0.Add(2*time.Second), down)
	check(s3, "a path down")
	gone := vol("a", tgtA, model.PathLive, model.PathAbsent) // nvme1 gone
	gone.Devices = []volume.BlockDevice{{Name: "nvme2n1"}}
	s4 := put(m, t0.Add(3*time.Second), gone)
	// The older snapshots ask after the newer one built its index.
	check(s4, "an object gone, a device replaced")
	check(s3, "a path down, asked later")
	check(s1, "first, asked later")
	s5 := m.Update(func(tx *model.Txn) {
		tx.SetFact("a", "fs", model.Fact{ReadAt: t0, Condition: volume.Condition{Status: volume.Healthy}})
	})
	check(s5, "a fact")
	i := model.Volume{ID: "i", Target: tgtI, Scope: model.Owned, Paths: []model.Path{{Endpoint: "127.0.0.1:3260", Object: "session5", State: model.PathLive}}}
	s6 := put(m, t0.Add(4*time.Second), i)
	check(s6, "a volume added")
	s7 := m.Update(func(tx *model.Txn) { tx.Delete("a") })
	check(s7, "a volume deleted")
	check(s5, "a fact, asked later")
	st := m.Stamp(t0.Add(5 * time.Second))
	s8 := m.Update(func(tx *model.Txn) { tx.Sweep(st, func(model.Volume) bool { return false }) })
	check(s8, "swept")
	check(s6, "a volume added, asked later")
}
