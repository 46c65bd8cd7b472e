package volume

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The fuzzer works on strings, so each map is encoded as "k=v" entries
// separated by NUL; keys cannot contain '=', values can.
const fuzzSep = "\x00"

func encodeFuzzMap(m map[string]string) string {
	var entries []string
	for _, k := range sortedKeys(m) {
		entries = append(entries, k+"="+m[k])
	}
	return strings.Join(entries, fuzzSep)
}

func decodeFuzzMap(s string) map[string]string {
	m := map[string]string{}
	if s == "" {
		return m
	}
	for _, e := range strings.Split(s, fuzzSep) {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return m
}

// FuzzParse checks the contract of Parse on arbitrary maps:
//   - it never panics and is deterministic;
//   - an error is a *FieldError naming a key that was given or documented,
//     with no partial result;
//   - no secret value ever appears in an error;
//   - a result is well formed, survives Encode and JSON, and
//     Parse(c.Encode()) == c.
func FuzzParse(f *testing.F) {
	for _, tc := range validCases {
		f.Add(encodeFuzzMap(tc.vc), encodeFuzzMap(tc.secrets))
	}
	for _, tc := range invalidCases {
		f.Add(encodeFuzzMap(tc.vc), encodeFuzzMap(tc.secrets))
	}
	f.Fuzz(func(t *testing.T, vcEnc, secEnc string) {
		vc, secrets := decodeFuzzMap(vcEnc), decodeFuzzMap(secEnc)
		c, s, err := Parse(vc, secrets)

		_, _, again := Parse(maps.Clone(vc), maps.Clone(secrets))
		if errText(err) != errText(again) {
			t.Fatalf("Parse is not deterministic: %v, then %v", err, again)
		}
		if !strings.Contains(vcEnc+secEnc, leakMarker) {
			checkNoSecretLeak(t, vc, secrets)
		}

		if err != nil {
			checkFieldError(t, err, vc, secrets)
			if c.Transport != "" || c.NVMe != nil || c.ISCSI != nil || s != (Secrets{}) {
				t.Fatalf("partial result with error %v: %+v", err, c)
			}
			return
		}
		checkWellFormed(t, c)
		checkRoundTrip(t, c, s, secrets)
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func checkFieldError(t *testing.T, err error, vc, secrets map[string]string) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *FieldError", err, err)
	}
	if fe.Key == "" || fe.Reason == "" {
		t.Fatalf("FieldError with an empty key or reason: %#v", fe)
	}
	_, given := vc[fe.Key]
	if fe.Secret {
		_, given = secrets[fe.Key]
	}
	if _, documented := keyIndex[fe.Key]; !given && !documented && fe.Key != EmptyKey {
		t.Fatalf("error names key %q, which is neither given nor documented: %v", fe.Key, err)
	}
}

// leakMarker is wrapped around every secret value for a second Parse; the
// marker showing up in an error means part of a secret was echoed.
const leakMarker = "Qz7SeCrEtMaRkEr7zQ"

func markSecret(v string) string {
	// Keep a DH-HMAC-CHAP prefix intact, so the marked value still reaches
	// the checks past the prefix.
	if len(v) >= len("DHHC-1:00:") && strings.HasPrefix(v, dhchapPrefix) {
		return v[:10] + leakMarker + v[10:] + leakMarker
	}
	return leakMarker + v + leakMarker
}

func checkNoSecretLeak(t *testing.T, vc, secrets map[string]string) {
	t.Helper()
	mvc, msecrets := maps.Clone(vc), maps.Clone(secrets)
	for k, v := range mvc {
		if d, ok := keyIndex[k]; ok && d.Secret {
			mvc[k] = markSecret(v)
		}
	}
	for k, v := range msecrets {
		msecrets[k] = markSecret(v)
	}
	if _, _, err := Parse(mvc, msecrets); err != nil && strings.Contains(err.Error(), leakMarker) {
		t.Fatalf("error echoes a secret value: %v", err)
	}
}

func checkWellFormed(t *testing.T, c Context) {
	t.Helper()
	switch c.Transport {
	case TransportNVMeTCP:
		n := c.NVMe
		if n == nil || c.ISCSI != nil {
			t.Fatalf("nvme-tcp context with the wrong sub-struct: %+v", c)
		}
		if len(n.Endpoints) == 0 || n.NQN == "" || (n.NSID == 0 && n.NGUID == "" && n.UUID == "") {
			t.Fatalf("nvme-tcp context misses a required field: %+v", n)
		}
		if len(n.OptimizedEndpoints) >= len(n.Endpoints) && len(n.OptimizedEndpoints) > 0 {
			t.Fatalf("optimizedEndpoints names every endpoint instead of being empty: %+v", n)
		}
		checkEndpoints(t, n.Endpoints)
	case TransportISCSI:
		if c.ISCSI == nil || c.NVMe != nil {
			t.Fatalf("iscsi context with the wrong sub-struct: %+v", c)
		}
		if len(c.ISCSI.Portals) == 0 || c.ISCSI.IQN == "" {
			t.Fatalf("iscsi context misses a required field: %+v", c.ISCSI)
		}
		checkEndpoints(t, c.ISCSI.Portals)
	default:
		t.Fatalf("unknown transport %q accepted", c.Transport)
	}
}

func checkEndpoints(t *testing.T, eps []Endpoint) {
	t.Helper()
	for i, ep := range eps {
		if ep.Port == 0 || ep.Host == "" || ep.Host != strings.ToLower(ep.Host) || strings.ContainsAny(ep.Host, "[]%, ") {
			t.Fatalf("endpoint %+v is not normalized", ep)
		}
		if slices.Contains(eps[:i], ep) {
			t.Fatalf("endpoint %+v listed twice", ep)
		}
	}
}

func checkRoundTrip(t *testing.T, c Context, s Secrets, secrets map[string]string) {
	t.Helper()
	enc := c.Encode()
	for k := range enc {
		if keyIndex[k].Secret {
			t.Fatalf("Encode emits the secret key %q", k)
		}
	}
	again, s2, err := Parse(enc, secrets)
	if err != nil {
		t.Fatalf("Parse(Encode(c)) failed: %v\nencoded: %q", err, enc)
	}
	if diff := cmp.Diff(c, again); diff != "" {
		t.Fatalf("Parse(Encode(c)) != c (-c +again):\n%s", diff)
	}
	if !c.Equal(again) {
		t.Fatal("Equal is false for Parse(Encode(c)) and c")
	}
	if diff := cmp.Diff(s, s2); diff != "" {
		t.Fatalf("secrets changed on re-parse (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(enc, again.Encode()); diff != "" {
		t.Fatalf("Encode is not stable (-first +second):\n%s", diff)
	}
	if !c.Equal(roundTripJSON(t, c)) {
		t.Fatal("Context changes through JSON, so a record would not compare equal")
	}
}
