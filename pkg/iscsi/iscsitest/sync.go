package iscsitest

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// Tree is a topology materialized in a directory that a test then
// changes the way the kernel changes sysfs (sysfstest.Sync): attributes are
// rewritten in place, sessions, LUNs and maps come and go, and a session
// or map whose Gen changed is a new object under an old name, built anew
// with new inode numbers.
type Tree struct {
	*sysfstest.Tree
	topo Topology
}

// NewTree writes topo below dir (which must exist and be empty); ages
// count back from now.
func NewTree(dir string, topo Topology, now time.Time) (*Tree, error) {
	st, err := sysfstest.NewTree(dir, topo.Fixture(), now)
	if err != nil {
		return nil, err
	}
	return &Tree{Tree: st, topo: topo.Clone()}, nil
}

// Topology is what the tree shows now.
func (t *Tree) Topology() Topology { return t.topo.Clone() }

// Apply changes the tree to show next.
func (t *Tree) Apply(next Topology) error {
	next = next.Clone()
	if err := t.Tree.Apply(next.Fixture(), t.recreated(next)); err != nil {
		return err
	}
	t.topo = next
	return nil
}

// recreated lists the directories and links of the sessions and maps
// whose Gen differs between the tree's topology and next. A re-created
// session brings its own SCSI host, as with iscsi_tcp.
func (t *Tree) recreated(next Topology) []string {
	var out []string
	for _, s := range next.Sessions {
		i := slices.IndexFunc(t.topo.Sessions, func(o Session) bool { return o.ID == s.ID })
		if i < 0 || t.topo.Sessions[i].Gen == s.Gen {
			continue
		}
		host := "host" + strconv.Itoa(s.Host)
		out = append(out, "devices/platform/"+host, "class/iscsi_host/"+host, "class/scsi_host/"+host,
			"class/iscsi_session/session"+strconv.Itoa(s.ID))
		for c := range max(s.Conns, 1) {
			out = append(out, fmt.Sprintf("class/iscsi_connection/connection%d:%d", s.ID, c))
		}
		for _, l := range s.LUNs {
			if l.Disk != "" {
				out = append(out, "block/"+l.Disk)
			}
		}
	}
	for _, m := range next.Maps {
		i := slices.IndexFunc(t.topo.Maps, func(o Map) bool { return o.Device == m.Device })
		if i >= 0 && t.topo.Maps[i].Gen != m.Gen {
			out = append(out, "devices/virtual/block/"+m.Device, "block/"+m.Device)
		}
	}
	return out
}

// Clone returns a deep copy of t.
func (t Topology) Clone() Topology {
	out := Topology{Sessions: slices.Clone(t.Sessions), Maps: slices.Clone(t.Maps)}
	for i := range out.Sessions {
		s := &out.Sessions[i]
		s.ConnStates = slices.Clone(s.ConnStates)
		s.LUNs = slices.Clone(s.LUNs)
		for j := range s.LUNs {
			s.LUNs[j].VPD83 = slices.Clone(s.LUNs[j].VPD83)
		}
	}
	for i := range out.Maps {
		out.Maps[i].Slaves = slices.Clone(out.Maps[i].Slaves)
		out.Maps[i].Holders = slices.Clone(out.Maps[i].Holders)
	}
	return out
}
