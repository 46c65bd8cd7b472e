package volume

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Parse validates the volume context and node-stage secrets of one volume
// and returns them normalized: two contexts that describe the same volume
// yield equal Contexts (see Context.Equal), whatever the spelling of
// addresses, identifiers and integers.
//
// Parse is the only reader of the volume-context contract documented in
// docs/volume-context.md and tabulated by Keys. Keys starting with
// IgnoredKeyPrefix are skipped in both maps; every other key must belong to
// the volume's transport, so a misspelt key is an error instead of a
// silently ignored setting.
//
// Every failure is a *FieldError naming one key. Checks run in a fixed
// order (transport, then context keys sorted, then secret keys sorted, then
// the values in documentation order), so the same input always reports the
// same error. No error text ever contains a secret value; volume context
// values may be quoted, truncated to a bounded length.
func Parse(volumeContext, secrets map[string]string) (Context, Secrets, error) {
	t, err := parseTransport(volumeContext)
	if err != nil {
		return Context{}, Secrets{}, err
	}
	if err := checkContextKeys(t, volumeContext); err != nil {
		return Context{}, Secrets{}, err
	}
	if err := checkSecretKeys(t, secrets); err != nil {
		return Context{}, Secrets{}, err
	}

	c := Context{Transport: t}
	var s Secrets
	switch t {
	case TransportNVMeTCP:
		if c.NVMe, err = parseNVMeTCP(volumeContext); err != nil {
			return Context{}, Secrets{}, err
		}
		if s, err = parseNVMeSecrets(secrets); err != nil {
			return Context{}, Secrets{}, err
		}
	case TransportISCSI:
		if c.ISCSI, err = parseISCSI(volumeContext); err != nil {
			return Context{}, Secrets{}, err
		}
		if s, err = parseISCSISecrets(secrets); err != nil {
			return Context{}, Secrets{}, err
		}
	}
	return c, s, nil
}

// ParseWithPublish is Parse for a request that carries a publish context
// as well: NodeStageVolume and NodePublishVolume. A storage system whose
// controller masks a LUN or namespace per host at ControllerPublishVolume
// (a CSIDriver with attachRequired: true) hands the node its attachment
// details there instead of in the volume context. Both maps take the same
// keys under the same rules; a key may be given in either, or in both with
// byte-for-byte the same value. A key given in both with different values,
// or a credential in the publish context, is a *FieldError with Publish
// set, as is every error about a key only the publish context gave.
func ParseWithPublish(volumeContext, publishContext, secrets map[string]string) (Context, Secrets, error) {
	merged, fromPublish, err := mergePublish(volumeContext, publishContext)
	if err != nil {
		return Context{}, Secrets{}, err
	}
	c, s, err := Parse(merged, secrets)
	var fe *FieldError
	if errors.As(err, &fe) && !fe.Secret && (fromPublish[fe.Key] || fe.Key == EmptyKey && fromPublish[""]) {
		fe.Publish = true
	}
	return c, s, err
}

// mergePublish returns the volume context with the keys only the publish
// context gives added, and the set of those keys. It never modifies its
// arguments, and never quotes a value: the two values of a conflicting key
// may be as long as their maps.
func mergePublish(vc, pc map[string]string) (map[string]string, map[string]bool, error) {
	if len(pc) == 0 {
		return vc, nil, nil
	}
	merged := make(map[string]string, len(vc)+len(pc))
	for k, v := range vc {
		merged[k] = v
	}
	fromPublish := map[string]bool{}
	for _, k := range sortedKeys(pc) {
		if strings.HasPrefix(k, IgnoredKeyPrefix) {
			continue
		}
		if d, ok := keyIndex[k]; ok && d.Secret {
			return nil, nil, &FieldError{Key: k, Publish: true, Reason: "secrets must come from node-stage secrets, not the publish context"}
		}
		if v, ok := vc[k]; ok {
			if v != pc[k] {
				return nil, nil, &FieldError{Key: k, Publish: true, Reason: "is given in the volume context and in the publish context with different values; the two must agree"}
			}
			continue
		}
		merged[k] = pc[k]
		fromPublish[k] = true
	}
	return merged, fromPublish, nil
}

// EmptyKey is the FieldError.Key reported for a key that is the empty
// string, so that FieldError.Key is never empty.
const EmptyKey = "<empty key>"

func parseTransport(vc map[string]string) (Transport, error) {
	v, ok := vc[keyTransport]
	if !ok || v == "" {
		return "", fieldErr(keyTransport, "required; one of %s", transportList())
	}
	for _, t := range Transports {
		if Transport(v) == t {
			return t, nil
		}
	}
	return "", fieldErr(keyTransport, "unknown transport %s; known transports: %s", quoteValue(v), transportList())
}

func transportList() string {
	names := make([]string, len(Transports))
	for i, t := range Transports {
		names[i] = string(t)
	}
	return strings.Join(names, ", ")
}

// checkContextKeys rejects, in sorted key order, every volume context key
// that the transport does not take, every secret key (secrets in the volume
// context are readable by anyone who can read the PV), and every empty
// value (usually a template that rendered nothing).
func checkContextKeys(t Transport, vc map[string]string) error {
	known := knownKeys(t, false)
	for _, k := range sortedKeys(vc) {
		if strings.HasPrefix(k, IgnoredKeyPrefix) {
			continue
		}
		d, ok := keyIndex[k]
		switch {
		case k == "":
			return fieldErr(EmptyKey, "a key is the empty string; remove it")
		case ok && d.Secret:
			// The value is deliberately not echoed: it is a secret that
			// has already leaked into the PV; it must not leak into events.
			return fieldErr(k, "secrets must come from node-stage secrets, not the volume context")
		case !ok || (d.Transport != t && d.Transport != anyTransport):
			return unknownKeyErr(k, t, d, known, false)
		}
		if vc[k] == "" {
			if d.Required {
				return fieldErr(k, "required, but the value is empty")
			}
			return fieldErr(k, "value is empty; omit the key to use the default")
		}
	}
	return nil
}

// checkSecretKeys is checkContextKeys for the node-stage secrets. Values are
// never looked at here beyond emptiness.
func checkSecretKeys(t Transport, secrets map[string]string) error {
	known := knownKeys(t, true)
	for _, k := range sortedKeys(secrets) {
		if strings.HasPrefix(k, IgnoredKeyPrefix) {
			continue
		}
		if k == "" {
			return secretErr(EmptyKey, "a key is the empty string; remove it")
		}
		d, ok := keyIndex[k]
		if !ok || !d.Secret || d.Transport != t {
			return unknownKeyErr(k, t, d, known, true)
		}
		if secrets[k] == "" {
			return secretErr(k, "value is empty; remove the key to turn the feature off")
		}
	}
	return nil
}

// unknownKeyErr explains why key k is not accepted: it belongs to another
// transport, it belongs in the other map, or it is unknown; in the last case
// a close known key is suggested.
func unknownKeyErr(k string, t Transport, d KeyDoc, known []string, secret bool) error {
	kind := "key"
	if secret {
		kind = "secret key"
	}
	var hint string
	switch {
	case d.Key == "":
		if s := suggest(k, known); s != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
		}
	case d.Transport != t && d.Transport != anyTransport:
		hint = fmt.Sprintf(" (it belongs to transport %s)", d.Transport)
	case secret && !d.Secret:
		hint = " (it belongs in the volume context)"
	}
	reason := fmt.Sprintf("unknown %s for transport %s%s; known %ss: %s",
		kind, t, hint, kind, strings.Join(known, ", "))
	if secret {
		return secretErr(k, "%s", reason)
	}
	return fieldErr(k, "%s", reason)
}

// parseInt parses a decimal integer in r. Only an optional '-' and ASCII
// digits are accepted: strconv alone would also take a leading '+', and
// "+5" or " 5" in a volume context is a sign of a broken template.
func parseInt(s string, r intRange) (int64, string) {
	digits := strings.TrimPrefix(s, "-")
	if !isDigits(digits) {
		return 0, fmt.Sprintf("%s is not a decimal integer; want %s", quoteValue(s), r)
	}
	// A syntactically valid number that overflows int64 comes back as
	// ±MaxInt64 with ErrRange, which the range check below rejects.
	n, _ := strconv.ParseInt(s, 10, 64)
	if !r.contains(n) {
		return 0, fmt.Sprintf("%s is out of range; want %s", quoteValue(s), r)
	}
	return n, ""
}

// optionalInt parses key when present. A nil result means the key is absent.
func optionalInt(vc map[string]string, key string, r intRange) (*int, error) {
	v, ok := vc[key]
	if !ok {
		return nil, nil
	}
	n, reason := parseInt(v, r)
	if reason != "" {
		return nil, fieldErr(key, "%s", reason)
	}
	i := int(n)
	return &i, nil
}

// maxQuoted bounds how much of a bad value an error repeats. Errors end up
// in Kubernetes events and logs, where a multi-kilobyte value is noise.
const maxQuoted = 64

// quoteValue quotes a volume context value for an error message. It must
// never be called with a secret.
func quoteValue(v string) string {
	if len(v) > maxQuoted {
		return strconv.Quote(v[:maxQuoted]) + "..."
	}
	return strconv.Quote(v)
}

func fieldErr(key, format string, args ...any) error {
	return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

func secretErr(key, format string, args ...any) error {
	return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...), Secret: true}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
