package nvmetest

import (
	"fmt"
	"strconv"
	"time"
)

// Topology is an NVMe host as the kernel would publish it.
type Topology struct {
	// NoMultipath writes the layout of nvme_core.multipath=N: no heads
	// in the subsystem directories, one block device per controller and
	// namespace (nvme<C>n<H>). The default is native multipath: a head
	// nvme<S>n<H> per namespace and hidden legs nvme<S>c<C>n<H>.
	NoMultipath bool
	Subsystems  []Subsystem
}

// Subsystem is one kernel subsystem instance.
type Subsystem struct {
	// Instance is N of nvme-subsysN.
	Instance int
	// Gen tells kernel objects that carry the same name apart: a Tree
	// re-creates the subsystem's directories when it changes. The
	// fixture does not show it.
	Gen int
	NQN string
	// Model, Serial, Type and IOPolicy default to "pathmend-test",
	// a serial derived from Instance, "nvm" and "numa".
	Model, Serial, Type, IOPolicy string
	// Age is how long before the write time the subsystem was created;
	// when zero, the age of its oldest controller (the kernel creates a
	// subsystem with its first controller).
	Age         time.Duration
	Namespaces  []Namespace
	Controllers []Controller
}

// Namespace is one namespace the subsystem exports.
type Namespace struct {
	// Head is H, the head instance shared by every device name.
	Head int
	// Gen tells namespaces that carry the same head instance apart: a
	// Tree re-creates the head and its legs when it changes.
	Gen  int
	NSID uint32
	// NGUID and UUID are written in the kernel's UUID layout; an empty
	// value hides the attribute as the kernel does for a zero ID (the
	// kernel shows the NGUID as uuid when there is no UUID; so does
	// this package).
	NGUID, UUID string
	// Sectors is the size in 512-byte sectors (default 131072).
	Sectors uint64
	// Dev is the head's (or per-controller disk's) device number,
	// "259:3"; by default derived from the subsystem and head instances.
	Dev string
}

// Controller is one controller of the subsystem.
type Controller struct {
	// Instance is X of nvmeX.
	Instance int
	// Gen tells controllers that carry the same name apart: a Tree
	// re-creates the controller's directories when it changes.
	Gen int
	// State is written to state verbatim (default "live").
	State string
	// Transport defaults to "tcp".
	Transport string
	// Traddr and Trsvcid default to 192.0.2.1 and 4420; HostTraddr and
	// HostIface are written to address only when set. SrcAddr is
	// written only while the controller is live, as the kernel does;
	// it defaults to Traddr's host side "192.0.2.100".
	Traddr, Trsvcid, HostTraddr, HostIface, SrcAddr string
	// CntlID defaults to Instance+1.
	CntlID int
	// Age is how long before the write time the controller was created
	// (the mtime of its directory).
	Age time.Duration
	// Legs maps a head instance to the ANA state of this controller's
	// leg to it. A head missing from the map gets no leg; NoANA writes
	// a leg without ana_state and ana_grpid.
	Legs map[int]string
	// ANAGroup is written to every leg's ana_grpid (default 1).
	ANAGroup int
	// CtrlLossTmo, ReconnectDelay and FastIOFailTmo are written
	// verbatim (defaults "600", "10", "off"); KATO defaults to 5.
	CtrlLossTmo, ReconnectDelay, FastIOFailTmo string
	KATO                                       int
	// HostNQN and HostID default to the lab's
	// "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"
	// and "00000000-0000-4000-8000-000000000001"; QueueCount and SQSize
	// to 3 and 127 (two I/O queues of 128 entries).
	HostNQN, HostID    string
	QueueCount, SQSize int
}

// NoANA as a Legs value writes a leg of a controller that does not use
// ANA: the kernel then hides ana_state and ana_grpid.
const NoANA = "-"

// Healthy returns a topology of subsystems subsystems, each with
// controllers controllers and namespaces namespaces, every controller live
// with a leg to every namespace: the first controller's legs optimized,
// the others non-optimized. Controller X of subsystem S goes to
// 192.0.2.1:(4420+X mod controllers); instances are numbered densely.
func Healthy(subsystems, controllers, namespaces int) Topology {
	var t Topology
	ctrl := 0
	for s := range subsystems {
		sub := Subsystem{Instance: s, NQN: fmt.Sprintf("nqn.2024-01.io.pathmend.test:sub-%d", s)}
		for h := 1; h <= namespaces; h++ {
			sub.Namespaces = append(sub.Namespaces, Namespace{
				Head: h,
				NSID: uint32(h),
				UUID: fmt.Sprintf("%08x-0000-4000-8000-%012x", s, h),
			})
		}
		for c := range controllers {
			legs := make(map[int]string, namespaces)
			for h := 1; h <= namespaces; h++ {
				legs[h] = "non-optimized"
				if c == 0 {
					legs[h] = "optimized"
				}
			}
			sub.Controllers = append(sub.Controllers, Controller{
				Instance: ctrl,
				Trsvcid:  strconv.Itoa(4420 + c),
				Age:      time.Hour,
				Legs:     legs,
			})
			ctrl++
		}
		t.Subsystems = append(t.Subsystems, sub)
	}
	return t
}

// Effective returns c as a Tree writes it: with the defaults documented
// on the fields filled in.
func (c Controller) Effective() Controller { return c.withDefaults() }

// withDefaults fills in the defaults documented on the fields.
func (c Controller) withDefaults() Controller {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.State, "live")
	def(&c.Transport, "tcp")
	def(&c.Traddr, "192.0.2.1")
	def(&c.Trsvcid, "4420")
	def(&c.SrcAddr, "192.0.2.100")
	def(&c.CtrlLossTmo, "600")
	def(&c.ReconnectDelay, "10")
	def(&c.FastIOFailTmo, "off")
	def(&c.HostID, "00000000-0000-4000-8000-000000000001")
	def(&c.HostNQN, "nqn.2014-08.org.nvmexpress:uuid:"+c.HostID)
	if c.QueueCount == 0 {
		c.QueueCount = 3
	}
	if c.SQSize == 0 {
		c.SQSize = 127
	}
	if c.CntlID == 0 {
		c.CntlID = c.Instance + 1
	}
	if c.ANAGroup == 0 {
		c.ANAGroup = 1
	}
	if c.KATO == 0 {
		c.KATO = 5
	}
	return c
}

// withDefaults fills in the defaults documented on the fields.
func (s Subsystem) withDefaults() Subsystem {
	if s.Model == "" {
		s.Model = "pathmend-test"
	}
	if s.Serial == "" {
		s.Serial = fmt.Sprintf("%020x", s.Instance+1)
	}
	if s.Type == "" {
		s.Type = "nvm"
	}
	if s.IOPolicy == "" {
		s.IOPolicy = "numa"
	}
	return s
}

// address renders the controller's address attribute the way
// drivers/nvme/host/tcp.c does.
func (c Controller) address() string {
	a := "traddr=" + c.Traddr + ",trsvcid=" + c.Trsvcid
	if c.HostTraddr != "" {
		a += ",host_traddr=" + c.HostTraddr
	}
	if c.HostIface != "" {
		a += ",host_iface=" + c.HostIface
	}
	if c.State == "live" {
		a += ",src_addr=" + c.SrcAddr
	}
	return a
}
