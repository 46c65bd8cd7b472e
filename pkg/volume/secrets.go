package volume

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
)

// String and GoString cover %v, %+v, %s, %q, %x and %#v, but fmt prints
// struct fields for other verbs (%d), and JSON encoders and structured
// loggers do not call String at all. The methods below close those paths,
// so no formatter or log sink can reveal a secret.

// Format implements fmt.Formatter: every verb prints the redacted String.
func (s Secrets) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }

// MarshalJSON renders only which secrets are present, never their values.
func (s Secrets) MarshalJSON() ([]byte, error) { return json.Marshal(s.presence()) }

// MarshalLog implements logr.Marshaler (used by klog's structured and JSON
// output): only which secrets are present.
func (s Secrets) MarshalLog() any { return s.presence() }

// LogValue implements slog.LogValuer: only which secrets are present.
func (s Secrets) LogValue() slog.Value {
	p := s.presence()
	return slog.GroupValue(
		slog.Bool("dhchap", p.DHCHAP), slog.Bool("dhchapCtrl", p.DHCHAPCtrl),
		slog.Bool("chap", p.CHAP), slog.Bool("chapIn", p.CHAPIn))
}

// secretsPresence is the loggable shape of Secrets.
type secretsPresence struct {
	DHCHAP     bool `json:"dhchap"`
	DHCHAPCtrl bool `json:"dhchapCtrl"`
	CHAP       bool `json:"chap"`
	CHAPIn     bool `json:"chapIn"`
}

func (s Secrets) presence() secretsPresence {
	return secretsPresence{
		DHCHAP:     s.DHCHAPSecret != "",
		DHCHAPCtrl: s.DHCHAPCtrlSecret != "",
		CHAP:       s.CHAPPassword != "",
		CHAPIn:     s.CHAPPasswordIn != "",
	}
}
