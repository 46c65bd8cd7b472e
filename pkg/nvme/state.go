package nvme

// ControllerState is the value of class/nvme/<ctrl>/state, exactly as the
// kernel prints it (drivers/nvme/host/core.c, nvme_sysfs_show_state).
type ControllerState string

// The controller states of Linux 6.1. A state the kernel adds later reads
// as an unknown ControllerState; diagnosis treats it as "not sure" and
// reports nothing that depends on it.
const (
	// StateNew: allocated, not yet connected.
	StateNew ControllerState = "new"
	// StateLive: connected; I/O flows.
	StateLive ControllerState = "live"
	// StateResetting: a reset is in progress (keep-alive loss, error
	// recovery or a reset_controller write).
	StateResetting ControllerState = "resetting"
	// StateConnecting: (re)connecting; a fabrics controller retries every
	// reconnect_delay seconds until ctrl_loss_tmo runs out, then the
	// kernel deletes it.
	StateConnecting ControllerState = "connecting"
	// StateDeleting: the kernel is deleting the controller.
	StateDeleting ControllerState = "deleting"
	// StateDeletingNoIO: deleting after its I/O queues were torn down.
	StateDeletingNoIO ControllerState = "deleting (no IO)"
	// StateDead: the kernel gave up on the controller; it will not
	// recover by itself.
	StateDead ControllerState = "dead"
)

// Known reports whether s is one of the states Linux 6.1 prints.
func (s ControllerState) Known() bool {
	switch s {
	case StateNew, StateLive, StateResetting, StateConnecting, StateDeleting, StateDeletingNoIO, StateDead:
		return true
	}
	return false
}

// Deleting reports whether the kernel is already deleting the controller.
func (s ControllerState) Deleting() bool {
	return s == StateDeleting || s == StateDeletingNoIO
}

// ANAState is the value of a leg's ana_state attribute (drivers/nvme/host/
// multipath.c, nvme_ana_state_names), or "" when the kernel publishes none
// because the controller does not use ANA.
type ANAState string

// The ANA states the kernel prints.
const (
	ANAOptimized      ANAState = "optimized"
	ANANonOptimized   ANAState = "non-optimized"
	ANAInaccessible   ANAState = "inaccessible"
	ANAPersistentLoss ANAState = "persistent-loss"
	ANAChange         ANAState = "change"
	// ANANone means the leg has no ana_state attribute: the controller
	// does not report ANA, and a live controller's path is usable.
	ANANone ANAState = ""
)

// Usable reports whether I/O may be sent down a path in this ANA state
// when its controller is live.
func (a ANAState) Usable() bool {
	return a == ANAOptimized || a == ANANonOptimized || a == ANANone
}

// rank orders ANA states for teardown: what a path contributes least is
// torn down first. Unknown values rank with inaccessible.
func (a ANAState) rank() int {
	switch a {
	case ANAOptimized, ANANone:
		return 3
	case ANANonOptimized:
		return 2
	}
	return 1
}
