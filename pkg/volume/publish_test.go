package volume

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A controller that masks namespaces or LUNs per host hands the node its
// attachment details in the publish context; ParseWithPublish reads them
// with the volume context under the same keys and rules.
func TestParseWithPublish(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vc, pc  map[string]string
		want    Context
		wantKey string // "" when the parse succeeds
		publish bool
		reason  string
	}{
		{name: "no publish context is Parse", vc: nvmeBase, want: nvmeWant(nil)},
		{name: "attachment details only in the publish context",
			vc:   map[string]string{"transport": "nvme-tcp"},
			pc:   map[string]string{"nqn": "nqn.2014-08.com.example:sub1", "endpoints": "192.0.2.10:4420,192.0.2.11:4420", "nsid": "1"},
			want: nvmeWant(nil)},
		{name: "everything in the publish context",
			pc: nvmeBase, want: nvmeWant(nil)},
		{name: "a key in both with the same value",
			vc: nvmeBase, pc: map[string]string{"nsid": "1"}, want: nvmeWant(nil)},
		{name: "Kubernetes keys are ignored in the publish context too",
			vc: nvmeBase, pc: map[string]string{IgnoredKeyPrefix + "pod.name": "p", "nsid": "1"}, want: nvmeWant(nil)},
		{name: "a key in both with different values",
			vc: nvmeBase, pc: map[string]string{"nsid": "2"},
			wantKey: "nsid", publish: true, reason: "different values; the two must agree"},
		{name: "the same address spelt differently is still two values",
			vc: nvmeBase, pc: map[string]string{"endpoints": "192.0.2.10:4420, 192.0.2.11:4420"},
			wantKey: "endpoints", publish: true, reason: "different values"},
		{name: "a credential in the publish context",
			vc: iscsiBase, pc: map[string]string{"chapPassword": "publish-leak-1"},
			wantKey: "chapPassword", publish: true, reason: "not the publish context"},
		{name: "an unknown key only the publish context gives",
			vc: nvmeBase, pc: map[string]string{"lunMask": "3"},
			wantKey: "lunMask", publish: true, reason: "unknown key for transport nvme-tcp"},
		{name: "a bad value only the publish context gives",
			vc: withKeys(nvmeBase, "nsid", drop), pc: map[string]string{"nsid": "0"},
			wantKey: "nsid", publish: true, reason: "out of range"},
		{name: "an error about a volume context key names the volume context",
			vc: withKeys(nvmeBase, "nqn", "bad"), pc: map[string]string{"nsid": "1"},
			wantKey: "nqn", reason: `must start with "nqn."`},
		{name: "an empty key in the publish context",
			vc: nvmeBase, pc: map[string]string{"": "x"},
			wantKey: EmptyKey, publish: true, reason: "empty string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vcBefore, pcBefore := withKeys(tc.vc), withKeys(tc.pc)
			c, _, err := ParseWithPublish(tc.vc, tc.pc, nil)
			if diff := cmp.Diff(vcBefore, withKeys(tc.vc)); diff != "" {
				t.Errorf("volume context changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(pcBefore, withKeys(tc.pc)); diff != "" {
				t.Errorf("publish context changed (-before +after):\n%s", diff)
			}
			if tc.wantKey == "" {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, c); diff != "" {
					t.Errorf("context (-want +got):\n%s", diff)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			if fe.Key != tc.wantKey || fe.Publish != tc.publish || !strings.Contains(fe.Reason, tc.reason) {
				t.Errorf("got %+v (%v), want key %q publish=%t reason containing %q", *fe, err, tc.wantKey, tc.publish, tc.reason)
			}
			if tc.publish && !strings.HasPrefix(err.Error(), "publish context key ") {
				t.Errorf("error %q does not name the publish context", err)
			}
			for _, v := range tc.pc {
				if len(v) >= 4 && strings.Contains(err.Error(), v) && IsCredentialKey(fe.Key) {
					t.Errorf("error %q repeats a credential", err)
				}
			}
		})
	}
}

func TestIsCredentialKey(t *testing.T) {
	for _, d := range Keys() {
		for _, k := range []string{d.Key, strings.ToUpper(d.Key), "example.com/" + d.Key} {
			if got := IsCredentialKey(k); got != d.Secret {
				t.Errorf("IsCredentialKey(%q) = %t, want %t (the contract's Secret)", k, got, d.Secret)
			}
		}
	}
	// By shape: the last segment of the key, after '/' or '.', holds
	// pass, secret, key, token, cred, auth or chap in any case.
	for _, k := range []string{"chapPasword", "password", "iscsi.secret", "node.session.auth.password", "apiToken", "privateKey", "Credentials",
		"pass", "auth.key", "PASS", "x/passwd", "auth", "oauthBearer", "sshKey", "csi.storage.k8s.io/serviceAccount.tokens", "CHAP"} {
		if !IsCredentialKey(k) {
			t.Errorf("IsCredentialKey(%q) = false, want true", k)
		}
	}
	for _, k := range []string{"", "fsType", "csi.storage.k8s.io/pod.name", "lunMask", "keystone.example.com/region", "auth.mode", "keepAliveTmo"} {
		if IsCredentialKey(k) {
			t.Errorf("IsCredentialKey(%q) = true, want false", k)
		}
	}
}

// BenchmarkParse_MaxEndpoints is the cost of the largest endpoint list the
// parser accepts, with optimizedEndpoints naming half of it.
func BenchmarkParse_MaxEndpoints(b *testing.B) {
	all := manyEndpoints(MaxEndpoints, 4420)
	half := manyEndpoints(MaxEndpoints/2, 4420)
	vc := withKeys(nvmeBase, "endpoints", all, "optimizedEndpoints", half)
	for b.Loop() {
		if _, _, err := Parse(vc, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParse_TooManyEndpoints is the cost of refusing 160,000
// endpoints (2.7 MB): one count of the commas.
func BenchmarkParse_TooManyEndpoints(b *testing.B) {
	vc := withKeys(nvmeBase, "endpoints", manyEndpoints(160000, 4420))
	for b.Loop() {
		if _, _, err := Parse(vc, nil); err == nil {
			b.Fatal("accepted")
		}
	}
}
