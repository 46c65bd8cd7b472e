package volume

import (
	"fmt"
	"strings"
)

// The validators in this file return a reason ("" when the value is valid)
// rather than an error, so the caller decides which key the reason belongs
// to. A reason never repeats the value: for secrets that is the rule, and
// for the rest the caller quotes the value once, bounded by quoteValue.

// maxNameLen bounds NQNs (NVMe Base Specification, NVMF_NQN_SIZE in Linux)
// and iSCSI names (RFC 3720 §3.2.6.1): both are at most 223 bytes.
const maxNameLen = 223

// discoveryNQN is the well-known NQN of discovery controllers. They expose
// no namespaces, so a volume can never live there.
const discoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// uuidNQNPrefix starts the NQN form derived from a UUID rather than from a
// domain the vendor owns (NVMe Base Specification, "NVMe Qualified Names").
const uuidNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

// nameChars accepts printable ASCII without spaces, commas and '='. NQNs,
// iSCSI names and interface names end up in the key=value,… option string
// written to /dev/nvme-fabrics and in iscsiadm arguments, where a comma, a
// '=', a space or a control character would split or corrupt the option.
// It is the parser's half of one rule: the fabrics option encoder refuses
// the same bytes, and FuzzConnectOptions (pkg/nvme) proves that every
// context Parse accepts encodes, so a bad name is InvalidArgument at parse
// time, never a connect that fails on every retry.
func nameChars(s string) string {
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case b == ',':
			return "contains a comma"
		case b == '=':
			return "contains '='"
		case b <= ' ' || b >= 0x7f:
			return "contains whitespace, a control character or a non-ASCII byte"
		}
	}
	return ""
}

// checkNQN validates an NVMe Qualified Name. NQNs are compared byte for byte
// by the kernel and the target, so the value is never rewritten.
func checkNQN(s string) string {
	if len(s) > maxNameLen {
		return fmt.Sprintf("is %d bytes long; an NQN is at most %d bytes", len(s), maxNameLen)
	}
	if r := nameChars(s); r != "" {
		return r
	}
	rest, ok := strings.CutPrefix(s, "nqn.")
	if !ok {
		return `must start with "nqn.", e.g. nqn.2014-08.com.example:subsystem1`
	}
	if s == discoveryNQN {
		return "is the discovery NQN; give the NQN of the subsystem that holds the namespace"
	}
	if r := checkNamingAuthority(rest); r != "" {
		return r
	}
	if u, ok := strings.CutPrefix(s, uuidNQNPrefix); ok {
		if r := checkUUIDSyntax(u); r != "" {
			return "UUID form " + uuidNQNPrefix + "<uuid>: " + r
		}
	}
	return ""
}

// checkIQN validates an iSCSI name in any of the three RFC 3720 formats.
// iSCSI names are case-insensitive, but the value is kept as given because
// it is echoed back in logins and matched against the node records of
// iscsiadm.
func checkIQN(s string) string {
	if len(s) > maxNameLen {
		return fmt.Sprintf("is %d bytes long; an iSCSI name is at most %d bytes", len(s), maxNameLen)
	}
	if r := nameChars(s); r != "" {
		return r
	}
	switch {
	case strings.HasPrefix(s, "iqn."):
		return checkNamingAuthority(s[len("iqn."):])
	case strings.HasPrefix(s, "eui."):
		if !isHex(s[len("eui."):], 16) {
			return "eui. form needs exactly 16 hex digits after the prefix"
		}
	case strings.HasPrefix(s, "naa."):
		if h := s[len("naa."):]; !isHex(h, 16) && !isHex(h, 32) {
			return "naa. form needs exactly 16 or 32 hex digits after the prefix"
		}
	default:
		return `must start with "iqn.", "eui." or "naa.", e.g. iqn.2001-04.com.example:storage`
	}
	return ""
}

// checkNamingAuthority validates the part of an iqn. or nqn. name after the
// type prefix: "yyyy-mm.reverse.domain", optionally followed by ':' and a
// non-empty string chosen by the naming authority.
func checkNamingAuthority(s string) string {
	if len(s) < len("yyyy-mm.") || !isDigits(s[0:4]) || s[4] != '-' || !isDigits(s[5:7]) || s[7] != '.' {
		return "must continue with a date yyyy-mm and a '.', e.g. 2014-08.com.example"
	}
	if m := s[5:7]; m < "01" || m > "12" {
		return "month of the date must be 01..12"
	}
	domain, suffix, hasSuffix := strings.Cut(s[len("yyyy-mm."):], ":")
	if r := checkReverseDomain(domain); r != "" {
		return r
	}
	if hasSuffix && suffix == "" {
		return "nothing follows the ':' after the domain"
	}
	return ""
}

// checkReverseDomain validates the naming authority's domain, written
// most-significant label first ("com.example"). Labels follow the host name
// rules of RFC 1123; case is allowed either way.
func checkReverseDomain(d string) string {
	if d == "" {
		return "the reverse domain name after the date is empty"
	}
	for _, label := range strings.Split(d, ".") {
		if r := checkLabel(label); r != "" {
			return "reverse domain name: " + r
		}
	}
	return ""
}

// checkLabel validates one DNS label: 1..63 letters, digits and hyphens,
// not starting or ending with a hyphen.
func checkLabel(l string) string {
	if l == "" {
		return "has an empty label"
	}
	if len(l) > 63 {
		return "has a label longer than 63 characters"
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return "has a label starting or ending with '-'"
	}
	for i := 0; i < len(l); i++ {
		switch b := l[i]; {
		case isAlnum(b) || b == '-':
		case b < ' ' || b >= 0x7f:
			return "has a label with a control character or a non-ASCII byte; only letters, digits and '-' are allowed"
		default:
			return fmt.Sprintf("has a label with the character %q; only letters, digits and '-' are allowed", b)
		}
	}
	return ""
}

// checkHostname validates a DNS host name (RFC 1123). An all-numeric last
// label is rejected (RFC 3696 §2) because such a "name" is a mistyped IPv4
// address, e.g. "10.0.0.256" or "10.0.0".
func checkHostname(h string) string {
	name := strings.TrimSuffix(h, ".")
	if name == "" {
		return "host is empty"
	}
	if len(name) > 253 {
		return "host name is longer than 253 characters"
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if r := checkLabel(l); r != "" {
			return "host name " + r
		}
	}
	if isDigits(labels[len(labels)-1]) {
		return "is neither a valid IP address nor a host name"
	}
	return ""
}

// normalizeNGUID accepts 32 hex digits, optionally grouped with single
// dashes (the kernel's sysfs "nguid" attribute prints 8-4-4-4-12), and
// returns them lowercase without dashes.
func normalizeNGUID(s string) (string, string) {
	if strings.HasPrefix(s, "-") || strings.HasSuffix(s, "-") || strings.Contains(s, "--") {
		return "", "dashes may only separate groups of hex digits"
	}
	h := strings.ReplaceAll(s, "-", "")
	if !isHex(h, 32) {
		return "", "must be 32 hex digits (dashes between groups allowed)"
	}
	h = strings.ToLower(h)
	if strings.Trim(h, "0") == "" {
		return "", "is all zero, which means the namespace has no NGUID"
	}
	return h, ""
}

// normalizeUUID accepts the canonical 8-4-4-4-12 form in either case and
// returns it lowercase.
func normalizeUUID(s string) (string, string) {
	if r := checkUUIDSyntax(s); r != "" {
		return "", r
	}
	u := strings.ToLower(s)
	if strings.Trim(u, "0-") == "" {
		return "", "is all zero, which means the namespace has no UUID"
	}
	return u, ""
}

// checkUUIDSyntax validates the 8-4-4-4-12 hex form of RFC 9562.
func checkUUIDSyntax(s string) string {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return "must be a UUID in the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	}
	if !isHex(s[0:8]+s[9:13]+s[14:18]+s[19:23]+s[24:], 32) {
		return "must be a UUID in the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	}
	return ""
}

// checkIfaceName follows the kernel's dev_valid_name: at most IFNAMSIZ-1
// (15) bytes, not "." or "..", no '/', ':' or whitespace. Commas are
// rejected as well because host_iface is passed in the comma-separated
// fabrics option string, and non-ASCII because no real interface needs it.
func checkIfaceName(s string) string {
	if len(s) > 15 {
		return fmt.Sprintf("is %d characters long; an interface name is at most 15", len(s))
	}
	if s == "." || s == ".." {
		return "is not an interface name"
	}
	if r := nameChars(s); r != "" {
		return r
	}
	if strings.ContainsAny(s, "/:") {
		return "contains '/' or ':', which no interface name may contain"
	}
	return ""
}

func isAlnum(b byte) bool {
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9')
}

// isDigits reports whether s is non-empty and only ASCII decimal digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isHex reports whether s is exactly n hex digits of either case.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= '0' && b <= '9') && !(b >= 'a' && b <= 'f') && !(b >= 'A' && b <= 'F') {
			return false
		}
	}
	return true
}
