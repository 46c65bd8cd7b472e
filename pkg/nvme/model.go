package nvme

import (
	"slices"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Host is one read of the NVMe state of a node: every subsystem, every
// controller and every namespace the kernel publishes. It is a snapshot:
// Read builds it and nothing mutates it afterwards, so one Host can be
// shared by every reader of a monitor tick.
type Host struct {
	// Subsystems in subsystem instance order.
	Subsystems []Subsystem `json:"subsystems"`
	// Controllers in controller instance order, including controllers no
	// subsystem lists (Subsystem == "").
	Controllers []Controller `json:"controllers"`
	// Skipped lists what Read left out because it changed while being
	// read. A subsystem named here is unsettled: Inspect decides nothing
	// about it until a later read sees it whole.
	Skipped []Skip `json:"skipped,omitempty"`
	// Scope is what the read read: ScopeAll (Read), or ScopePaths, whose
	// Host leaves the attributes no decision reads zero.
	Scope Scope `json:"scope,omitempty"`
}

// Skip is an object Read left out of a Host.
type Skip struct {
	// Path is the sysfs path of the object, e.g. "class/nvme/nvme4".
	Path string `json:"path"`
	// Subsystem is the subsystem the object belonged to, "" when unknown.
	Subsystem SubsystemName `json:"subsystem,omitempty"`
	// Reason says why, e.g. "vanished during the read".
	Reason string `json:"reason"`
}

// Subsystem is one kernel subsystem instance, class/nvme-subsystem/<name>.
// Two instances may answer one NQN; see heal.AmbiguousHead.
type Subsystem struct {
	Name SubsystemName `json:"name"`
	// NQN is class/nvme-subsystem/<subsys>/subsysnqn.
	NQN string `json:"nqn"`
	// Model is class/nvme-subsystem/<subsys>/model without its padding.
	Model string `json:"model"`
	// Serial is class/nvme-subsystem/<subsys>/serial without its padding.
	Serial string `json:"serial"`
	// IOPolicy is class/nvme-subsystem/<subsys>/iopolicy ("numa",
	// "round-robin"); "" on a kernel built without native multipath.
	IOPolicy string `json:"iopolicy,omitempty"`
	// Type is class/nvme-subsystem/<subsys>/subsystype ("nvm",
	// "discovery"); "" on kernels before 5.18.
	Type string `json:"type,omitempty"`
	// Controllers are the member controllers: the nvme<N> links in
	// class/nvme-subsystem/<subsys>/, in instance order.
	Controllers []ControllerName `json:"controllers"`
	// Namespaces are the namespaces the subsystem exports to this host,
	// in head instance order.
	Namespaces []Namespace `json:"namespaces"`
}

// Discovery reports whether this is a discovery subsystem, which exports
// no namespaces by design.
func (s *Subsystem) Discovery() bool {
	return s.Type == "discovery" || s.NQN == DiscoveryNQN
}

// DiscoveryNQN is the well-known NQN of discovery subsystems.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// Controller is one NVMe controller, class/nvme/<ctrl>: a path from this
// host to a subsystem through one fabric endpoint.
type Controller struct {
	Name ControllerName `json:"name"`
	// Subsystem is the subsystem instance that lists this controller;
	// "" when none does (a controller being created or deleted).
	Subsystem SubsystemName `json:"subsystem"`
	// State is class/nvme/<ctrl>/state.
	State ControllerState `json:"state"`
	// Transport is class/nvme/<ctrl>/transport: "tcp", "rdma", "fc",
	// "loop" or "pcie".
	Transport string `json:"transport"`
	// Address is class/nvme/<ctrl>/address parsed; zero for PCIe, whose
	// address is a PCI slot (RawAddress). A fabrics controller's address
	// is read only while the controller is live (see AddressUnknown);
	// while it is not, it is the one read when it last was, without
	// SrcAddr.
	Address Address `json:"address"`
	// AddressUnknown is set for a fabrics controller the reader has not
	// seen live: its address is not read while it is resetting,
	// connecting or being deleted (on Debian's 6.1 kernel that read can
	// oops in nvme_tcp_get_address and leave the controller resetting
	// for good), so which endpoint it goes to is not known. Address is
	// zero then. Every decision about endpoints treats such a controller
	// as possibly going to any endpoint of its subsystem: it is never
	// counted as a healthy path, never torn down as a stale endpoint,
	// and no endpoint it may be connecting is connected again.
	AddressUnknown bool `json:"addressUnknown,omitempty"`
	// RawAddress is class/nvme/<ctrl>/address as read; "" when the
	// kernel publishes none, or when the controller is not live.
	RawAddress string `json:"rawAddress,omitempty"`
	// CntlID is class/nvme/<ctrl>/cntlid, the controller ID the target
	// assigned.
	CntlID uint16 `json:"cntlid"`
	// SubsysNQN is class/nvme/<ctrl>/subsysnqn.
	SubsysNQN string `json:"subsysnqn"`
	// HostNQN is class/nvme/<ctrl>/hostnqn; "" for PCIe controllers.
	HostNQN string `json:"hostnqn,omitempty"`
	// CtrlLossTmo is class/nvme/<ctrl>/ctrl_loss_tmo (fabrics only).
	CtrlLossTmo Timeout `json:"ctrlLossTmo"`
	// ReconnectDelay is class/nvme/<ctrl>/reconnect_delay (fabrics only).
	ReconnectDelay Timeout `json:"reconnectDelay"`
	// FastIOFailTmo is class/nvme/<ctrl>/fast_io_fail_tmo (fabrics only).
	FastIOFailTmo Timeout `json:"fastIOFailTmo"`
	// KATO is class/nvme/<ctrl>/kato, the keep-alive timeout in seconds.
	KATO int `json:"kato"`
	// Model is class/nvme/<ctrl>/model without its 40-byte padding.
	Model string `json:"model"`
	// Serial is class/nvme/<ctrl>/serial without its padding.
	Serial string `json:"serial"`
	// CreatedAt is the mtime of the controller's sysfs directory, which
	// the kernel sets when it creates the controller. Zero when it could
	// not be read, so policy can tell "young" from "unknown".
	CreatedAt time.Time `json:"createdAt,omitzero"`
}

// Fabrics reports whether the controller is an NVMe-oF controller, which
// publishes the fabrics attributes (hostnqn, timeouts) and an address of
// key=value pairs.
func (c *Controller) Fabrics() bool {
	switch c.Transport {
	case "tcp", "rdma", "fc", "loop":
		return true
	}
	return false
}

// Endpoint is the controller's fabric identity, stable across re-creation.
func (c *Controller) Endpoint() Endpoint {
	return Endpoint{
		Transport:  c.Transport,
		Traddr:     c.Address.Traddr,
		Trsvcid:    c.Address.Trsvcid,
		HostTraddr: c.Address.HostTraddr,
		HostIface:  c.Address.HostIface,
	}
}

// AddressNotKnown is what operators are told about a controller whose
// address is unknown (Controller.AddressUnknown).
const AddressNotKnown = "address not yet known (controller connecting)"

// EndpointText renders the controller's endpoint for operators and
// defect keys: Endpoint().String(), or the transport and AddressNotKnown
// when the address is unknown.
func (c *Controller) EndpointText() string {
	if c.AddressUnknown {
		return c.Transport + ", " + AddressNotKnown
	}
	return c.Endpoint().String()
}

// Namespace is one namespace a subsystem exports, with the paths that lead
// to it. With native multipath it is a head block device
// (class/nvme-subsystem/<subsys>/<head>) and one hidden leg per
// contributing controller (class/nvme/<ctrl>/<leg>); with multipath off
// there is no head and each contributing controller has its own block
// device (class/nvme/<ctrl>/<disk>).
type Namespace struct {
	// Subsystem is the subsystem instance exporting the namespace.
	Subsystem SubsystemName `json:"subsystem"`
	// HeadInstance is the H shared by every device name of the namespace
	// (nvme<S>n<H>, nvme<S>c<C>n<H>, nvme<C>n<H>).
	HeadInstance int `json:"headInstance"`
	// Head is the multipath head block device; "" when multipath is off.
	Head DeviceName `json:"head,omitempty"`
	// NSID is <device>/nsid.
	NSID uint32 `json:"nsid"`
	// NGUID is <device>/nguid as the kernel prints it (UUID layout); ""
	// when the namespace has none.
	NGUID string `json:"nguid,omitempty"`
	// UUID is <device>/uuid; "" when the kernel hides it. Note the kernel
	// prints the NGUID here when the namespace has no UUID.
	UUID string `json:"uuid,omitempty"`
	// WWID is <device>/wwid, the identifier udev links by-id.
	WWID string `json:"wwid"`
	// Sectors is <device>/size, in 512-byte sectors.
	Sectors uint64 `json:"sectors"`
	// Dev is <device>/dev, the block device's number (of the head; with
	// multipath off, of the last per-controller disk read); zero when the
	// tree does not publish it. Fixed for the device's life: a head the
	// kernel removes and makes again has a new one.
	Dev volume.DeviceNumber `json:"dev,omitzero"`
	// Paths are the legs (or per-controller disks) in controller instance
	// order.
	Paths []Path `json:"paths"`
}

// Devices are the block devices a workload could use for the namespace:
// the head, or every per-controller disk when multipath is off.
func (n *Namespace) Devices() []DeviceName {
	if n.Head != "" {
		return []DeviceName{n.Head}
	}
	devs := make([]DeviceName, 0, len(n.Paths))
	for _, p := range n.Paths {
		devs = append(devs, p.Device)
	}
	return devs
}

// Path is one controller's leg to a namespace.
type Path struct {
	// Controller is the controller the leg goes through (the directory
	// the leg is a child of).
	Controller ControllerName `json:"controller"`
	// Device is the leg "nvme0c1n1", or the per-controller disk
	// "nvme1n1" when multipath is off.
	Device DeviceName `json:"device"`
	// ANAState is <leg>/ana_state; "" when the controller does not use
	// ANA.
	ANAState ANAState `json:"anaState,omitempty"`
	// ANAGroup is <leg>/ana_grpid; 0 when the kernel publishes none.
	ANAGroup uint32 `json:"anaGroup,omitempty"`
}

// Controller returns the controller named name.
func (h *Host) Controller(name ControllerName) (*Controller, bool) {
	i, ok := slices.BinarySearchFunc(h.Controllers, name, func(c Controller, n ControllerName) int {
		return compareInstance(c.Name.Instance(), n.Instance(), string(c.Name), string(n))
	})
	if !ok {
		return nil, false
	}
	return &h.Controllers[i], true
}

// Subsystem returns the subsystem instance named name.
func (h *Host) Subsystem(name SubsystemName) (*Subsystem, bool) {
	i, ok := slices.BinarySearchFunc(h.Subsystems, name, func(s Subsystem, n SubsystemName) int {
		return compareInstance(s.Name.Instance(), n.Instance(), string(s.Name), string(n))
	})
	if !ok {
		return nil, false
	}
	return &h.Subsystems[i], true
}

// compareInstance orders kernel names by instance number, then by text
// (which only matters for names that carry no number).
func compareInstance(a, b int, as, bs string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	case as < bs:
		return -1
	case as > bs:
		return 1
	}
	return 0
}
