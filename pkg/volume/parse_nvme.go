package volume

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"net"
	"strings"
)

// parseNVMeTCP reads the nvme-tcp keys of a volume context whose key set
// checkContextKeys has already accepted, in documentation order.
func parseNVMeTCP(vc map[string]string) (*NVMeTCP, error) {
	n := &NVMeTCP{}

	v, ok := vc[keyNQN]
	if !ok {
		return nil, fieldErr(keyNQN, "required for transport nvme-tcp")
	}
	if r := checkNQN(v); r != "" {
		return nil, fieldErr(keyNQN, "%s %s", quoteValue(v), r)
	}
	n.NQN = v

	v, ok = vc[keyEndpoints]
	if !ok {
		return nil, fieldErr(keyEndpoints, "required for transport nvme-tcp, e.g. 192.0.2.10:4420,192.0.2.11:4420")
	}
	var r string
	if n.Endpoints, r = parseEndpointList(v, 0); r != "" {
		return nil, fieldErr(keyEndpoints, "%s", r)
	}
	if err := checkIPEndpoints(n.Endpoints); err != nil {
		return nil, err
	}

	if v, ok := vc[keyOptimizedEndpoints]; ok {
		opt, err := parseOptimized(v, n.Endpoints)
		if err != nil {
			return nil, err
		}
		n.OptimizedEndpoints = opt
	}

	if err := parseNamespaceID(vc, n); err != nil {
		return nil, err
	}

	if v, ok := vc[keyHostTraddr]; ok {
		ip, r := normalizeIP(v)
		if r != "" {
			return nil, fieldErr(keyHostTraddr, "%s %s", quoteValue(v), r)
		}
		n.HostTraddr = ip
	}
	if v, ok := vc[keyHostIface]; ok {
		if r := checkIfaceName(v); r != "" {
			return nil, fieldErr(keyHostIface, "%s %s", quoteValue(v), r)
		}
		n.HostIface = v
	}

	for _, t := range []struct {
		key string
		r   intRange
		dst **int
	}{
		{keyCtrlLossTmo, rangeCtrlLossTmo, &n.CtrlLossTmo},
		{keyReconnectDelay, rangeReconnectDelay, &n.ReconnectDelay},
		{keyFastIOFailTmo, rangeFastIOFailTmo, &n.FastIOFailTmo},
		{keyKeepAliveTmo, rangeKeepAliveTmo, &n.KeepAliveTmo},
		{keyNrIOQueues, rangeNrIOQueues, &n.NrIOQueues},
	} {
		p, err := optionalInt(vc, t.key, t.r)
		if err != nil {
			return nil, err
		}
		*t.dst = p
	}
	return n, nil
}

// parseOptimized parses optimizedEndpoints against the already parsed
// endpoints. The result follows the order of endpoints, and is nil when it
// names every endpoint: both spellings mean "all paths optimized", and one
// normal form keeps Context.Equal honest.
func parseOptimized(v string, endpoints []Endpoint) ([]Endpoint, error) {
	opt, r := parseEndpointList(v, 0)
	if r != "" {
		return nil, fieldErr(keyOptimizedEndpoints, "%s", r)
	}
	listed := make(map[Endpoint]bool, len(endpoints))
	for _, ep := range endpoints {
		listed[ep] = false
	}
	for _, ep := range opt {
		if _, ok := listed[ep]; !ok {
			return nil, fieldErr(keyOptimizedEndpoints, "%s is not listed in endpoints", ep)
		}
		listed[ep] = true
	}
	if len(opt) == len(endpoints) {
		return nil, nil
	}
	ordered := make([]Endpoint, 0, len(opt))
	for _, ep := range endpoints {
		if listed[ep] {
			ordered = append(ordered, ep)
		}
	}
	return ordered, nil
}

// parseNamespaceID reads nsid, nguid and uuid. At least one is needed:
// a subsystem may hold many namespaces, and the driver must know which
// block device is this volume.
func parseNamespaceID(vc map[string]string, n *NVMeTCP) error {
	if v, ok := vc[keyNSID]; ok {
		id, r := parseInt(v, rangeNSID)
		if r != "" {
			return fieldErr(keyNSID, "%s", r)
		}
		n.NSID = uint32(id)
	}
	if v, ok := vc[keyNGUID]; ok {
		g, r := normalizeNGUID(v)
		if r != "" {
			return fieldErr(keyNGUID, "%s %s", quoteValue(v), r)
		}
		n.NGUID = g
	}
	if v, ok := vc[keyUUID]; ok {
		u, r := normalizeUUID(v)
		if r != "" {
			return fieldErr(keyUUID, "%s %s", quoteValue(v), r)
		}
		n.UUID = u
	}
	if n.NSID == 0 && n.NGUID == "" && n.UUID == "" {
		return fieldErr(keyNSID, "one of nsid, nguid, uuid is required to identify the namespace")
	}
	return nil
}

// parseNVMeSecrets reads the DH-HMAC-CHAP keys. A controller key alone is
// an error: bidirectional authentication starts with the host proving its
// own key.
func parseNVMeSecrets(secrets map[string]string) (Secrets, error) {
	var s Secrets
	if v, ok := secrets[keyDHCHAPSecret]; ok {
		if r := checkDHCHAPKey(v); r != "" {
			return Secrets{}, secretErr(keyDHCHAPSecret, "%s", r)
		}
		s.DHCHAPSecret = v
	}
	if v, ok := secrets[keyDHCHAPCtrlSecret]; ok {
		if r := checkDHCHAPKey(v); r != "" {
			return Secrets{}, secretErr(keyDHCHAPCtrlSecret, "%s", r)
		}
		if s.DHCHAPSecret == "" {
			return Secrets{}, secretErr(keyDHCHAPSecret, "required when dhchapCtrlSecret is set; bidirectional authentication needs the host key too")
		}
		s.DHCHAPCtrlSecret = v
	}
	return s, nil
}

// dhchapPrefix starts the textual DH-HMAC-CHAP key representation of the
// NVMe Base Specification (and of nvme gen-dhchap-key):
// "DHHC-1:" hh ":" base64(key || crc32(key)) ":"
// where hh is 00 (untransformed) or 01..03 (SHA-256/384/512 transform).
const dhchapPrefix = "DHHC-1:"

// checkDHCHAPKey validates a DH-HMAC-CHAP key the way Linux does before it
// will connect (nvme_auth_extract_key), so a truncated or mistyped secret is
// an InvalidArgument at stage time instead of an opaque EKEYREJECTED from
// the kernel. The reason never includes any part of the key.
func checkDHCHAPKey(v string) string {
	if strings.ContainsAny(v, ", \t\r\n\v\f") {
		return "contains a comma or whitespace (a trailing newline often comes from creating the secret with echo instead of echo -n)"
	}
	rest, ok := strings.CutPrefix(v, dhchapPrefix)
	if !ok {
		return `must start with "DHHC-1:" as printed by nvme gen-dhchap-key`
	}
	if len(rest) < 3 || rest[2] != ':' || !isDigits(rest[:2]) || rest[:2] > "03" {
		return `must continue with a transform id 00, 01, 02 or 03 and ':' after "DHHC-1:"`
	}
	// The trailing ':' is optional for the kernel as well.
	b64 := strings.TrimSuffix(rest[3:], ":")
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return "key material is not valid base64"
	}
	// 32, 48 or 64 key bytes followed by a 4-byte CRC-32.
	if len(raw) != 36 && len(raw) != 52 && len(raw) != 68 {
		return "key material must decode to a 32, 48 or 64 byte key plus a 4 byte checksum; the key is probably truncated"
	}
	key, sum := raw[:len(raw)-4], raw[len(raw)-4:]
	if crc32.ChecksumIEEE(key) != binary.LittleEndian.Uint32(sum) {
		return "checksum does not match the key; the key was probably mistyped or truncated"
	}
	return ""
}

// checkIPEndpoints refuses host names among nvme-tcp endpoints. The
// kernel's fabrics interface takes traddr as an IP literal and resolves no
// name, and the controllers it creates publish that literal in sysfs,
// which is what the monitor matches endpoints against: a name would parse
// here and then fail every connect, a retry kubelet repeats forever.
// (iSCSI portals may be names: iscsiadm resolves them, and pathmend
// resolves them the same way before it matches sessions.)
func checkIPEndpoints(eps []Endpoint) error {
	for i, ep := range eps {
		if net.ParseIP(ep.Host) == nil {
			return fieldErr(keyEndpoints, "item %d %s: is a host name; nvme-tcp endpoints must be IP addresses, since the kernel's fabrics interface resolves no names", i+1, quoteValue(ep.String()))
		}
	}
	return nil
}
