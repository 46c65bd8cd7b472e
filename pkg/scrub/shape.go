package scrub

import (
	"bytes"
	"strings"
)

// Secrets of a known shape, learnt from any text that carries them.
var (
	// dhchapPrefix starts a DH-HMAC-CHAP key in its textual form.
	dhchapPrefix = []byte("DHHC-1:")
	// authInfix is in the name of every CHAP setting of an iSCSI node
	// record (node.session.auth.password, discovery.sendtargets.auth.username_in …).
	authInfix = []byte(".auth.")
)

func shaped(text string) bool {
	return strings.Contains(text, "DHHC-1:") || strings.Contains(text, ".auth.")
}

func shapedBytes(p []byte) bool {
	return bytes.Contains(p, dhchapPrefix) || bytes.Contains(p, authInfix)
}

// learn adds every secret of a known shape in p to s and reports whether
// it found one.
func (s *Set) learn(p []byte) bool {
	found := false
	for rest := p; ; {
		i := bytes.Index(rest, dhchapPrefix)
		if i < 0 {
			break
		}
		key := dhchapKey(rest[i:])
		if key != "" {
			s.Add(DHCHAPKey, key)
			// The key's base64 part alone, as a tool may print it.
			if parts := strings.SplitN(key, ":", 4); len(parts) >= 3 {
				s.Add(DHCHAPKey, parts[2])
			}
			found = true
		}
		rest = rest[i+len(dhchapPrefix):]
	}
	for rest := p; ; {
		i := bytes.Index(rest, authInfix)
		if i < 0 {
			break
		}
		rest = rest[i+len(authInfix):]
		name := rest
		j := 0
		for j < len(name) && (alnum(name[j]) || name[j] == '_') {
			j++
		}
		setting := string(name[:j])
		if !strings.HasPrefix(setting, "username") && !strings.HasPrefix(setting, "password") {
			continue
		}
		if v := settingValue(name[j:]); v != "" {
			kind := NodeRecordSetting
			if strings.HasPrefix(setting, "username") {
				kind = CHAPUser
			}
			s.Add(kind, v)
			// A text may end the value at a space that is not its end:
			// its first word is scrubbed too.
			if w, _, ok := strings.Cut(v, " "); ok {
				s.Add(kind, w)
			}
			found = true
		}
	}
	return found
}

// dhchapKey returns the DH-HMAC-CHAP key p starts with
// ("DHHC-1:<2 digits>:<base64>:" — the final colon optional), or "".
func dhchapKey(p []byte) string {
	n := len(dhchapPrefix)
	if len(p) < n+3 || !digit(p[n]) || !digit(p[n+1]) || p[n+2] != ':' {
		return ""
	}
	j := n + 3
	start := j
	for j < len(p) && (alnum(p[j]) || p[j] == '+' || p[j] == '/' || p[j] == '=') {
		j++
	}
	if j-start < 8 {
		return ""
	}
	if j < len(p) && p[j] == ':' {
		j++
	}
	return string(p[:j])
}

func digit(c byte) bool { return c >= '0' && c <= '9' }

// settingValue returns the value after a node record setting's name:
// " = value" as iscsiadm prints a record, "=value" or ": value" as other
// texts put it; up to the end of the line, a quote or a comma. Empty, a
// placeholder ("<empty>") or a mask ("********") is no value.
func settingValue(p []byte) string {
	i := 0
	for i < len(p) && (p[i] == ' ' || p[i] == '\t') {
		i++
	}
	if i >= len(p) || (p[i] != '=' && p[i] != ':') {
		return ""
	}
	i++
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '"' || p[i] == '\'') {
		i++
	}
	j := i
	for j < len(p) && p[j] != '\n' && p[j] != '\r' && p[j] != '"' && p[j] != '\'' && p[j] != ',' && p[j] != '\\' {
		j++
	}
	v := strings.TrimSpace(string(p[i:j]))
	if v == "" || v == "<empty>" || strings.Trim(v, "*") == "" {
		return ""
	}
	return v
}
