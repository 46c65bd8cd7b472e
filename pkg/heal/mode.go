package heal

import "fmt"

// Mode says how far the healer may go. It is set once per process by the
// --heal flag and honoured by attach-time repair, the monitor and the iSCSI
// session heal alike.
type Mode string

const (
	// ModeRepair diagnoses, decides and acts.
	ModeRepair Mode = "repair"
	// ModeObserve diagnoses and logs the same verdicts ModeRepair would
	// reach, but never touches a path. Recommended for a first rollout.
	ModeObserve Mode = "observe"
	// ModeOff does not diagnose at all.
	ModeOff Mode = "off"
)

// Modes lists the accepted values of --heal.
var Modes = []Mode{ModeRepair, ModeObserve, ModeOff}

// ParseMode validates the value of --heal.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("invalid heal mode %q: want one of repair, observe, off", s)
}

// String returns the flag value of the mode.
func (m Mode) String() string { return string(m) }
