package driver

import (
	"fmt"
	"strings"
)

// maxNodeIDBytes is csi.proto's limit of NodeGetInfoResponse.node_id,
// which overrides the general one: "SHALL NOT exceed 256 bytes".
const maxNodeIDBytes = 256

// checkTopology applies csi.proto's rules for a topology segment that
// NodeGetInfo returns. The key: an optional prefix (at most 63 characters,
// lower-case DNS name notation) and "/", then a name of at most 63
// characters, alphanumeric at both ends with '-', '_' or '.' between. The
// value: at most 63 characters, the same characters as a name.
func checkTopology(key, value string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if err := checkTopologyPrefix(prefix); err != nil {
			return fmt.Errorf("topology key %q: prefix %w", key, err)
		}
		name = rest
	}
	if err := checkTopologyName(name); err != nil {
		return fmt.Errorf("topology key %q: name %w", key, err)
	}
	if err := checkTopologyName(value); err != nil {
		return fmt.Errorf("topology value %q: %w", value, err)
	}
	return nil
}

// checkTopologyName checks a key name or a segment value.
func checkTopologyName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("is empty")
	case len(s) > 63:
		return fmt.Errorf("is %d characters; at most 63", len(s))
	case !isAlnum(s[0]) || !isAlnum(s[len(s)-1]):
		return fmt.Errorf("must begin and end with a letter or digit")
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; !isAlnum(b) && b != '-' && b != '_' && b != '.' {
			return fmt.Errorf("has %q; only letters, digits, '-', '_' and '.' are allowed", b)
		}
	}
	return nil
}

// checkTopologyPrefix checks a key prefix: a lower-case DNS name.
func checkTopologyPrefix(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("is empty")
	case len(s) > 63:
		return fmt.Errorf("is %d characters; at most 63", len(s))
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("is not a DNS name (labels of lower-case letters, digits and inner '-')")
		}
		for i := 0; i < len(label); i++ {
			if b := label[i]; !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-') {
				return fmt.Errorf("has %q; only lower-case letters, digits, '-' and '.' are allowed", b)
			}
		}
	}
	return nil
}

func isAlnum(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}
