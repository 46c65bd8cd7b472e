package heal

import (
	"fmt"
	"time"
)

// Kind names a defect diagnosis can find. Kinds are stable strings: they
// appear in logs, metrics labels and the diagnose JSON schema.
type Kind string

const (
	// NoNamespace: a subsystem with live controllers exports no
	// namespace, so no block device can ever appear.
	NoNamespace Kind = "NoNamespace"
	// NamespaceMissing: the namespace a staged volume needs is absent
	// while its subsystem exports others.
	NamespaceMissing Kind = "NamespaceMissing"
	// ControllerNotContributing: a live controller has no path (leg) to a
	// namespace head its subsystem exports.
	ControllerNotContributing Kind = "ControllerNotContributing"
	// AmbiguousHead: two kernel subsystem instances answer one NQN; the
	// defect names the stale instance.
	AmbiguousHead Kind = "AmbiguousHead"
	// StaleEndpoint: a controller to an endpoint no staged volume lists,
	// or one the kernel has given up on.
	StaleEndpoint Kind = "StaleEndpoint"
)

// Scope is how much a repair of a defect tears down. Scopes are ordered:
// a smaller scope is narrower, and policy tries the narrowest first.
type Scope int

const (
	// ScopeController releases single controllers (paths).
	ScopeController Scope = iota + 1
	// ScopeSubsystem releases every controller of a subsystem instance.
	ScopeSubsystem
)

// String names the scope for logs and JSON.
func (s Scope) String() string {
	switch s {
	case ScopeController:
		return "controller"
	case ScopeSubsystem:
		return "subsystem"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// MarshalText makes a Scope render as its name in JSON.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Path is one kernel object a repair may tear down: an NVMe controller (or,
// later, an iSCSI session). Values are snapshots of one sysfs read.
type Path struct {
	// Name is the kernel's name, e.g. "nvme4". It changes when the path is
	// re-created.
	Name string `json:"name"`
	// Endpoint identifies the fabric endpoint, stable across re-creation,
	// e.g. "tcp 10.0.0.2:4420 host_traddr=10.0.0.9".
	Endpoint string `json:"endpoint"`
	// State is the kernel state at diagnosis ("live", "connecting", …).
	State string `json:"state"`
	// Access is the ANA state of the path's leg to the affected namespace
	// ("optimized", "non-optimized", "inaccessible", …), "" when it has
	// none.
	Access string `json:"access,omitempty"`
	// CreatedAt is when the kernel created the path; zero when unknown, so
	// policy can tell "young" from "unknown".
	CreatedAt time.Time `json:"createdAt,omitzero"`
}

// CoTenant is another namespace (and its block device) that a teardown
// would leave with no accessible path.
type CoTenant struct {
	// Namespace identifies it, e.g. "nvme-subsys0 nsid 2".
	Namespace string `json:"namespace"`
	// Device is its block device name, e.g. "nvme0n2".
	Device string `json:"device"`
}

// Defect is one thing diagnosis found wrong, with everything policy needs
// to decide on a repair. Defects are values; nothing mutates one after
// Inspect returns it.
type Defect struct {
	Kind  Kind  `json:"kind"`
	Scope Scope `json:"scope"`
	// Subject says what is broken, readable by an operator.
	Subject string `json:"subject"`
	// Key is the stable cooldown key: the fabric endpoint for controller
	// scope, the NQN for NoNamespace and NamespaceMissing, the subsystem
	// instance for AmbiguousHead.
	Key string `json:"key"`
	// Teardown lists what a repair releases, already in teardown order:
	// inaccessible and non-optimized legs before optimized ones.
	Teardown []Path `json:"teardown"`
	// CoTenants are the other namespaces this teardown would leave with
	// no accessible path. Empty when the teardown strands nobody.
	CoTenants []CoTenant `json:"coTenants,omitempty"`
	// Volumes are the staged volume IDs this defect affects, when known.
	Volumes []string `json:"volumes,omitempty"`
	// Detail explains the evidence in one sentence.
	Detail string `json:"detail"`
	// Blocked, when set, is why the owner of the node's intent forbids
	// any teardown of the defect's target now (a record that may be one
	// of its volumes cannot be read). Policy refuses the defect with it.
	Blocked string `json:"blocked,omitempty"`
}
