package fabrics

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Options are the fields of one connect. Transport, Traddr, Trsvcid, NQN,
// HostNQN and HostID are required; nil tunables leave the kernel default.
type Options struct {
	Transport  string // "tcp"
	Traddr     string // target address (IP literal)
	Trsvcid    string // target port
	NQN        string // subsystem NQN
	HostNQN    string
	HostID     string
	HostTraddr string // optional host-side address
	HostIface  string // optional host-side interface

	CtrlLossTmo    *int // seconds; -1 = forever
	ReconnectDelay *int // seconds
	FastIOFailTmo  *int // seconds; -1 = off
	KeepAliveTmo   *int // seconds
	NrIOQueues     *int
	QueueSize      *int // entries per I/O queue

	// DH-HMAC-CHAP secrets ("DHHC-1:…"); never logged.
	DHCHAPSecret     string
	DHCHAPCtrlSecret string
}

// String describes the connect without its secrets, for logs and errors.
func (o Options) String() string {
	s, err := o.encode(true)
	if err != nil {
		return "invalid options: " + err.Error()
	}
	return s
}

// Check reports whether the options encode: every required field set and
// no value carrying a separator the kernel would split on. Connect runs
// the same encoder; pkg/volume's parser refuses every volume context whose
// options would fail here (FuzzConnectOptions in pkg/nvme proves it).
func (o Options) Check() error {
	_, err := o.encode(true)
	return err
}

// Endpoint renders the fabric endpoint the way controller cooldown keys do:
// "tcp 10.0.0.2:4420" plus " host_traddr=…" / " host_iface=…" when pinned.
func (o Options) Endpoint() string {
	ep := o.Transport + " " + joinHostPort(o.Traddr, o.Trsvcid)
	if o.HostTraddr != "" {
		ep += " host_traddr=" + o.HostTraddr
	}
	if o.HostIface != "" {
		ep += " host_iface=" + o.HostIface
	}
	return ep
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// encode builds the option string the kernel parses (nvmf_parse_options).
// Values must not contain ',' or whitespace: the kernel splits on ',' and
// '\n' and would read a smuggled option. redact replaces secret values.
func (o Options) encode(redact bool) (string, error) {
	var errs []error
	req := func(k, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", k))
		}
	}
	req("transport", o.Transport)
	req("traddr", o.Traddr)
	req("trsvcid", o.Trsvcid)
	req("nqn", o.NQN)
	req("hostnqn", o.HostNQN)
	req("hostid", o.HostID)
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	for _, kv := range [][2]string{
		{"transport", o.Transport}, {"traddr", o.Traddr}, {"trsvcid", o.Trsvcid},
		{"nqn", o.NQN}, {"hostnqn", o.HostNQN}, {"hostid", o.HostID},
		{"host_traddr", o.HostTraddr}, {"host_iface", o.HostIface},
	} {
		if kv[1] == "" {
			continue
		}
		if strings.ContainsAny(kv[1], ", \t\n\r=") {
			return "", fmt.Errorf("%s %q contains a separator", kv[0], kv[1])
		}
		add(kv[0], kv[1])
	}
	for _, kv := range []struct {
		k string
		v *int
	}{
		{"ctrl_loss_tmo", o.CtrlLossTmo}, {"reconnect_delay", o.ReconnectDelay},
		{"fast_io_fail_tmo", o.FastIOFailTmo}, {"keep_alive_tmo", o.KeepAliveTmo},
		{"nr_io_queues", o.NrIOQueues}, {"queue_size", o.QueueSize},
	} {
		if kv.v != nil {
			add(kv.k, strconv.Itoa(*kv.v))
		}
	}
	for _, kv := range [][2]string{{"dhchap_secret", o.DHCHAPSecret}, {"dhchap_ctrl_secret", o.DHCHAPCtrlSecret}} {
		if kv[1] == "" {
			continue
		}
		if strings.ContainsAny(kv[1], ", \t\n\r") {
			return "", fmt.Errorf("%s contains a separator", kv[0])
		}
		if redact {
			add(kv[0], "<redacted>")
		} else {
			add(kv[0], kv[1])
		}
	}
	return b.String(), nil
}

// Result is what the kernel answers a successful connect with.
type Result struct {
	// Instance is N of the new controller nvmeN.
	Instance int
	// CntlID is the controller ID the target assigned.
	CntlID int
}

// Name is the controller's kernel name, "nvme<instance>".
func (r Result) Name() string { return "nvme" + strconv.Itoa(r.Instance) }

// parseResult parses "instance=N,cntlid=M\n". Unknown extra fields are
// ignored; instance is required.
func parseResult(s string) (Result, error) {
	s = strings.TrimRight(s, "\n\x00 ")
	r := Result{Instance: -1, CntlID: -1}
	for _, f := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Result{}, fmt.Errorf("fabrics answer %q: bad %s", s, k)
		}
		switch k {
		case "instance":
			r.Instance = n
		case "cntlid":
			r.CntlID = n
		}
	}
	if r.Instance < 0 {
		return Result{}, fmt.Errorf("fabrics answer %q has no instance", s)
	}
	return r, nil
}
