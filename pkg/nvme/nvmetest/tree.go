package nvmetest

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// Tree is a topology materialized in a directory that a test then
// changes the way the kernel changes sysfs (sysfstest.Sync): attributes are
// rewritten in place, objects come and go, and an object whose Gen
// changed is a new kernel object under an old name, whose directories
// are built anew with new inode numbers. It is what an incremental
// reader must never be fooled by.
type Tree struct {
	*sysfstest.Tree
	topo Topology
}

// NewTree writes topo below dir (which must exist and be empty). Ages
// count back from now, for this write and every later Apply.
func NewTree(dir string, topo Topology, now time.Time) (*Tree, error) {
	st, err := sysfstest.NewTree(dir, topo.Fixture(), now)
	if err != nil {
		return nil, err
	}
	return &Tree{Tree: st, topo: topo.Clone()}, nil
}

// Topology is what the tree shows now.
func (t *Tree) Topology() Topology { return t.topo.Clone() }

// Apply changes the tree to show next. A subsystem that stays the same
// object keeps its creation time (Age), whichever controllers it has now.
func (t *Tree) Apply(next Topology) error {
	next = next.Clone()
	for i := range next.Subsystems {
		s := &next.Subsystems[i]
		for _, prev := range t.topo.Subsystems {
			if prev.Instance == s.Instance && prev.Gen == s.Gen && s.Age == 0 {
				s.Age = prev.age()
			}
		}
	}
	if err := t.Tree.Apply(next.Fixture(), t.recreated(next)); err != nil {
		return err
	}
	t.topo = next
	return nil
}

// recreated lists the directories and links of the objects whose Gen
// differs between the tree's topology and next.
func (t *Tree) recreated(next Topology) []string {
	var out []string
	oldSubs := map[int]Subsystem{}
	oldCtrls := map[int]Controller{}
	for _, s := range t.topo.Subsystems {
		oldSubs[s.Instance] = s
		for _, c := range s.Controllers {
			oldCtrls[c.Instance] = c
		}
	}
	for _, s := range next.Subsystems {
		name := "nvme-subsys" + strconv.Itoa(s.Instance)
		prev, ok := oldSubs[s.Instance]
		if ok && prev.Gen != s.Gen {
			out = append(out, subsysDir+"/"+name, "class/nvme-subsystem/"+name)
		}
		for _, ns := range s.Namespaces {
			i := slices.IndexFunc(prev.Namespaces, func(o Namespace) bool { return o.Head == ns.Head })
			if !ok || i < 0 || prev.Namespaces[i].Gen == ns.Gen {
				continue
			}
			head := "nvme" + strconv.Itoa(s.Instance) + "n" + strconv.Itoa(ns.Head)
			out = append(out, subsysDir+"/"+name+"/"+head, "block/"+head)
			for _, c := range s.Controllers {
				ctrl := "nvme" + strconv.Itoa(c.Instance)
				if next.NoMultipath {
					disk := ctrl + "n" + strconv.Itoa(ns.Head)
					out = append(out, ctlDir+"/"+ctrl+"/"+disk, "block/"+disk)
				} else {
					out = append(out, ctlDir+"/"+ctrl+"/nvme"+strconv.Itoa(s.Instance)+"c"+strconv.Itoa(c.Instance)+"n"+strconv.Itoa(ns.Head))
				}
			}
		}
		for _, c := range s.Controllers {
			if oc, ok := oldCtrls[c.Instance]; ok && oc.Gen != c.Gen {
				name := "nvme" + strconv.Itoa(c.Instance)
				out = append(out, ctlDir+"/"+name, "class/nvme/"+name)
			}
		}
	}
	return out
}

// Clone returns a deep copy of t.
func (t Topology) Clone() Topology {
	out := Topology{NoMultipath: t.NoMultipath, Subsystems: slices.Clone(t.Subsystems)}
	for i := range out.Subsystems {
		s := &out.Subsystems[i]
		s.Namespaces = slices.Clone(s.Namespaces)
		s.Controllers = slices.Clone(s.Controllers)
		for j := range s.Controllers {
			s.Controllers[j].Legs = maps.Clone(s.Controllers[j].Legs)
		}
	}
	return out
}
