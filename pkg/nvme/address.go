package nvme

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Address is a fabrics controller's class/nvme/<ctrl>/address parsed into
// its fields. The kernel writes it as comma-separated key=value pairs
// (drivers/nvme/host/fabrics.c, nvmf_get_address, and tcp.c,
// nvme_tcp_get_address):
//
//	traddr=127.0.0.1,trsvcid=4420,host_traddr=10.0.0.9,host_iface=eth1,src_addr=10.0.0.9
//
// Fields the kernel did not print are empty. src_addr is the local socket
// address and is present only while the admin queue is connected.
type Address struct {
	Traddr     string `json:"traddr,omitempty"`
	Trsvcid    string `json:"trsvcid,omitempty"`
	HostTraddr string `json:"hostTraddr,omitempty"`
	HostIface  string `json:"hostIface,omitempty"`
	SrcAddr    string `json:"srcAddr,omitempty"`
}

// ParseAddress parses the address attribute of a fabrics controller. The
// empty string (a transport without addresses, nvme-loop) is valid and
// yields the zero Address. A pair without "=", an empty or repeated key is
// an error; keys a newer kernel may add are ignored.
func ParseAddress(s string) (Address, error) {
	var a Address
	if s == "" {
		return a, nil
	}
	seen := 0
	for pair := range strings.SplitSeq(s, ",") {
		key, value, ok := strings.Cut(pair, "=")
		if !ok || key == "" {
			return Address{}, fmt.Errorf("address %q: field %q is not key=value", s, pair)
		}
		var field *string
		bit := 0
		switch key {
		case "traddr":
			field, bit = &a.Traddr, 1
		case "trsvcid":
			field, bit = &a.Trsvcid, 2
		case "host_traddr":
			field, bit = &a.HostTraddr, 4
		case "host_iface":
			field, bit = &a.HostIface, 8
		case "src_addr":
			field, bit = &a.SrcAddr, 16
		default:
			continue
		}
		if seen&bit != 0 {
			return Address{}, fmt.Errorf("address %q: %s given twice", s, key)
		}
		seen |= bit
		*field = value
	}
	return a, nil
}

// Endpoint is the fabric identity of a controller: what a re-created
// controller keeps while its name changes. It is comparable.
type Endpoint struct {
	Transport  string `json:"transport"`
	Traddr     string `json:"traddr,omitempty"`
	Trsvcid    string `json:"trsvcid,omitempty"`
	HostTraddr string `json:"hostTraddr,omitempty"`
	HostIface  string `json:"hostIface,omitempty"`
}

// String renders the endpoint for operators and cooldown keys:
// "tcp 127.0.0.1:4420", "tcp [fd00::2]:4420 host_traddr=fd00::9 host_iface=eth1".
// An endpoint without traddr renders as its transport alone.
func (e Endpoint) String() string {
	var b strings.Builder
	b.WriteString(e.Transport)
	switch {
	case e.Traddr != "" && e.Trsvcid != "":
		b.WriteByte(' ')
		b.WriteString(net.JoinHostPort(e.Traddr, e.Trsvcid))
	case e.Traddr != "":
		b.WriteByte(' ')
		b.WriteString(e.Traddr)
	}
	if e.HostTraddr != "" {
		b.WriteString(" host_traddr=")
		b.WriteString(e.HostTraddr)
	}
	if e.HostIface != "" {
		b.WriteString(" host_iface=")
		b.WriteString(e.HostIface)
	}
	return b.String()
}

// Timeout is a fabrics timeout attribute in seconds (ctrl_loss_tmo,
// reconnect_delay, fast_io_fail_tmo), which the kernel prints as a number
// or as "off" when the timeout is disabled (-1 internally).
type Timeout struct {
	// Off is true when the kernel printed "off". Seconds is then 0.
	Off     bool `json:"off,omitempty"`
	Seconds int  `json:"seconds"`
}

// String renders the timeout the way the kernel does.
func (t Timeout) String() string {
	if t.Off {
		return "off"
	}
	return strconv.Itoa(t.Seconds)
}

// errSyntax is wrapped by the parse errors of numeric attributes.
var errSyntax = errors.New("not a kernel-printed number")

// ParseTimeout parses a timeout attribute: "off" or a decimal integer.
func ParseTimeout(s string) (Timeout, error) {
	if s == "off" {
		return Timeout{Off: true}, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return Timeout{}, fmt.Errorf("timeout %q: %w", s, errSyntax)
	}
	return Timeout{Seconds: int(n)}, nil
}

// parseUint parses a decimal attribute into an unsigned value of at most
// bits bits (nsid: 32, cntlid: 16, size: 64).
func parseUint(s string, bits int) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, bits)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, errSyntax)
	}
	return n, nil
}

// parseInt parses a decimal attribute printed with "%d" (kato).
func parseInt(s string) (int, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, errSyntax)
	}
	return int(n), nil
}
