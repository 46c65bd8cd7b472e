package volume

import (
	"fmt"
	"net"
	"strings"
)

// MaxEndpoints bounds the items of one endpoint or portal list. Arrays
// give a volume two to eight paths, a few large ones sixteen; 64 is more
// than any of them, and it keeps the monitor's work per volume, the size of
// a record and every error message bounded whatever a caller sends.
const MaxEndpoints = 64

// parseEndpointList parses a comma-separated list of endpoints. Items are
// trimmed of surrounding whitespace; empty items and duplicates (after
// normalization) are rejected because both are typos that would otherwise
// silently change the number of paths. defaultPort 0 makes the port
// mandatory. The list is counted before any item is parsed, and repeats are
// found through a set: the cost is linear in the length of v.
func parseEndpointList(v string, defaultPort uint16) ([]Endpoint, string) {
	if n := strings.Count(v, ",") + 1; n > MaxEndpoints {
		return nil, fmt.Sprintf("lists %d items; at most %d are accepted", n, MaxEndpoints)
	}
	items := strings.Split(v, ",")
	eps := make([]Endpoint, 0, len(items))
	seen := make(map[Endpoint]struct{}, len(items))
	for i, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Sprintf("item %d is empty", i+1)
		}
		ep, r := parseEndpoint(item, defaultPort)
		if r != "" {
			return nil, fmt.Sprintf("item %d %s: %s", i+1, quoteValue(item), r)
		}
		if _, dup := seen[ep]; dup {
			return nil, fmt.Sprintf("item %d: %s is listed twice", i+1, ep)
		}
		seen[ep] = struct{}{}
		eps = append(eps, ep)
	}
	return eps, ""
}

// parseEndpoint parses one host[:port] item and normalizes the host: IP
// addresses to their canonical text form (net.IP.String), host names to
// lowercase. IPv6 literals take brackets; without brackets an IPv6 literal
// is accepted only when a default port exists, since "fd00::1:3260" cannot
// be split into address and port without guessing.
func parseEndpoint(item string, defaultPort uint16) (Endpoint, string) {
	var host, port string
	switch {
	case strings.HasPrefix(item, "["):
		end := strings.IndexByte(item, ']')
		if end < 0 {
			return Endpoint{}, "'[' without a closing ']'"
		}
		host = item[1:end]
		switch rest := item[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			port = rest[1:]
			if port == "" {
				return Endpoint{}, "nothing follows the ':' after the address"
			}
		default:
			return Endpoint{}, "only ':port' may follow ']'"
		}
		if !strings.Contains(host, ":") {
			return Endpoint{}, "brackets are only for IPv6 addresses"
		}
	case strings.Count(item, ":") > 1:
		if defaultPort == 0 {
			return Endpoint{}, "an IPv6 address must be in brackets with a port, e.g. [fd00::1]:4420"
		}
		// A bare IPv6 literal: the whole item must be the address.
		host = item
		if net.ParseIP(host) == nil && !strings.Contains(host, "%") {
			return Endpoint{}, "is not an IPv6 address; write [address]:port to give a port"
		}
	default:
		var hasPort bool
		host, port, hasPort = strings.Cut(item, ":")
		if hasPort && port == "" {
			return Endpoint{}, "nothing follows the ':' after the host"
		}
	}

	ep := Endpoint{Port: defaultPort}
	if port != "" {
		n, r := parseInt(port, rangePort)
		if r != "" {
			return Endpoint{}, "port " + r
		}
		ep.Port = uint16(n)
	} else if defaultPort == 0 {
		return Endpoint{}, "port is required, e.g. 192.0.2.10:4420"
	}

	h, r := normalizeHost(host)
	if r != "" {
		return Endpoint{}, r
	}
	ep.Host = h
	return ep, ""
}

// normalizeHost accepts an IP address or a DNS host name and returns its
// canonical form.
func normalizeHost(h string) (string, string) {
	if h == "" {
		return "", "host is empty"
	}
	if strings.Contains(h, ":") {
		// Only IPv6 literals contain ':' (brackets were removed by the caller).
		return normalizeIP(h)
	}
	if ip := net.ParseIP(h); ip != nil {
		return normalizeIP(h)
	}
	if r := checkHostname(h); r != "" {
		return "", r
	}
	return strings.ToLower(h), ""
}

// normalizeIP accepts a unicast IP address and returns its canonical form,
// so "FD00:0:0::1" and "fd00::1" compare equal. Zones ("fe80::1%eth0") are
// rejected: link-local fabrics are not supported, and hostIface is the way
// to pin an interface. The unspecified, multicast and broadcast addresses
// can never be a target or a source of a connection.
func normalizeIP(s string) (string, string) {
	if strings.Contains(s, "%") {
		return "", "IPv6 zones are not supported; use hostIface to choose the interface"
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return "", "is not a valid IP address"
	}
	if ip.IsUnspecified() || ip.IsMulticast() || ip.Equal(net.IPv4bcast) {
		return "", "is not a unicast address"
	}
	return ip.String(), ""
}
