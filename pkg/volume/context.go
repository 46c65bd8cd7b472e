package volume

import (
	"fmt"
	"net"
	"strconv"
)

// Transport names the fabric a volume is attached over. It is the value of
// the volume context key "transport".
type Transport string

const (
	// TransportNVMeTCP attaches an NVMe-oF namespace over TCP.
	TransportNVMeTCP Transport = "nvme-tcp"
	// TransportISCSI attaches a SCSI LUN over iSCSI.
	TransportISCSI Transport = "iscsi"
)

// Transports lists every transport the parser accepts, in documentation order.
var Transports = []Transport{TransportNVMeTCP, TransportISCSI}

// Endpoint is one network address of a target: an NVMe-oF/TCP port or an
// iSCSI portal. Host is an IP address or a DNS name without brackets.
type Endpoint struct {
	Host string `json:"host"`
	Port uint16 `json:"port"`
}

// String renders the endpoint as host:port, with IPv6 literals in brackets.
func (e Endpoint) String() string {
	return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port)))
}

// Context is the validated volume context of one volume. Exactly one of
// NVMe and ISCSI is set, matching Transport. A Context never holds secrets;
// those travel separately in Secrets and are never persisted.
type Context struct {
	Transport Transport `json:"transport"`
	NVMe      *NVMeTCP  `json:"nvme,omitempty"`
	ISCSI     *ISCSI    `json:"iscsi,omitempty"`
}

// NVMeTCP is the volume context of an NVMe-oF/TCP volume.
type NVMeTCP struct {
	// NQN of the subsystem (key "nqn").
	NQN string `json:"nqn"`
	// Endpoints are every expected path, in the order given (key "endpoints").
	Endpoints []Endpoint `json:"endpoints"`
	// OptimizedEndpoints is the subset of Endpoints expected to be
	// ANA-optimized (key "optimizedEndpoints"); the rest are expected to be
	// non-optimized. Empty means every endpoint is treated as optimized.
	// Parse keeps them in the order of Endpoints and leaves the list empty
	// when it names every endpoint, since both spellings mean the same.
	OptimizedEndpoints []Endpoint `json:"optimizedEndpoints,omitempty"`
	// Namespace identity inside a possibly shared subsystem. At least one is
	// set; NSID 0 means "not given". NGUID is 32 lowercase hex digits, UUID
	// is the canonical lowercase 8-4-4-4-12 form.
	NSID  uint32 `json:"nsid,omitempty"`
	NGUID string `json:"nguid,omitempty"`
	UUID  string `json:"uuid,omitempty"`
	// HostTraddr and HostIface pin the host side of every connection
	// (keys "hostTraddr", "hostIface"); empty means the kernel chooses.
	HostTraddr string `json:"hostTraddr,omitempty"`
	HostIface  string `json:"hostIface,omitempty"`
	// Connection tunables; nil means the kernel default.
	CtrlLossTmo    *int `json:"ctrlLossTmo,omitempty"`    // seconds, -1 = reconnect forever
	ReconnectDelay *int `json:"reconnectDelay,omitempty"` // seconds
	FastIOFailTmo  *int `json:"fastIOFailTmo,omitempty"`  // seconds, -1 = off
	KeepAliveTmo   *int `json:"keepAliveTmo,omitempty"`   // seconds
	NrIOQueues     *int `json:"nrIOQueues,omitempty"`
}

// ISCSI is the volume context of an iSCSI volume.
type ISCSI struct {
	// IQN of the target (key "iqn"); iqn., eui. or naa. form.
	IQN string `json:"iqn"`
	// Portals, in the order given (key "portals"); port defaults to 3260.
	Portals []Endpoint `json:"portals"`
	// LUN number, 0–16383 (key "lun").
	LUN int `json:"lun"`
	// ReplacementTimeout in seconds (key "replacementTimeout"); nil means
	// the initiator's default.
	ReplacementTimeout *int `json:"replacementTimeout,omitempty"`
}

// Secrets are the node-stage secrets of one volume. They are parsed and
// validated with the context but never written to a record, a log line or
// an error string. String and GoString redact every value.
type Secrets struct {
	// NVMe DH-HMAC-CHAP (keys "dhchapSecret", "dhchapCtrlSecret").
	DHCHAPSecret     string
	DHCHAPCtrlSecret string
	// iSCSI CHAP (keys "chapUsername", "chapPassword", "chapUsernameIn",
	// "chapPasswordIn").
	CHAPUsername   string
	CHAPPassword   string
	CHAPUsernameIn string
	CHAPPasswordIn string
}

// String never reveals a secret value, only which secrets are present.
func (s Secrets) String() string {
	return fmt.Sprintf("Secrets{dhchap:%t dhchapCtrl:%t chap:%t chapIn:%t}",
		s.DHCHAPSecret != "", s.DHCHAPCtrlSecret != "", s.CHAPPassword != "", s.CHAPPasswordIn != "")
}

// GoString is String, so %#v cannot leak a secret either.
func (s Secrets) GoString() string { return s.String() }

// FieldError reports a volume context or secret key that failed validation.
// The driver maps it to codes.InvalidArgument. Reason never contains a
// secret value.
type FieldError struct {
	// Key is the volume context or secret key at fault. Never empty.
	Key string
	// Reason says what is wrong and, where it helps, what is accepted.
	Reason string
	// Secret is set when Key names a node-stage secret key, so the message
	// sends the administrator to the Secret object rather than the PV.
	Secret bool
	// Publish is set when Key came from the publish context (the
	// attachment details of ControllerPublishVolume) rather than the
	// volume context, so the message sends the administrator to the
	// storage system's controller rather than the PV.
	Publish bool
}

// Error renders `volume context key "k": reason`, or for a secret key
// `node-stage secret key "k": reason`, or for a key of the publish context
// `publish context key "k": reason`.
//
// The key is quoted and cut to maxQuoted bytes: it came from the caller,
// and an unknown key may be as long as the map it arrived in.
func (e *FieldError) Error() string {
	return fmt.Sprintf("%s key %s: %s", e.source(), quoteValue(e.Key), e.Reason)
}

func (e *FieldError) source() string {
	switch {
	case e.Secret:
		return "node-stage secret"
	case e.Publish:
		return "publish context"
	}
	return "volume context"
}
