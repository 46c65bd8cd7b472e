package volume

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/scrub"
)

// TestRecord_NeverHoldsSecrets parses a context together with secrets,
// stores the record and checks that no secret value reaches the disk.
func TestRecord_NeverHoldsSecrets(t *testing.T) {
	nvmeSecrets := map[string]string{"dhchapSecret": hostKey, "dhchapCtrlSecret": ctrlKey}
	iscsiSecrets := map[string]string{
		"chapUsername": "chap-user-0001", "chapPassword": "chap-pass-0001",
		"chapUsernameIn": "chap-user-in-0001", "chapPasswordIn": "chap-pass-in-0001",
	}
	s := newTestStore(t)
	for _, in := range []struct {
		vc, secrets map[string]string
	}{{nvmeBase, nvmeSecrets}, {iscsiBase, iscsiSecrets}} {
		c, sec, err := Parse(in.vc, in.secrets)
		if err != nil {
			t.Fatal(err)
		}
		if sec == (Secrets{}) {
			t.Fatal("Parse dropped the secrets; the test would prove nothing")
		}
		r := testRecord(string(c.Transport))
		r.Context = c
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
		onDisk, err := os.ReadFile(filepath.Join(s.Dir(), "volumes", recordName(r.VolumeID)))
		if err != nil {
			t.Fatal(err)
		}
		marshaled, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range in.secrets {
			if strings.Contains(string(onDisk), v) || strings.Contains(string(marshaled), v) {
				t.Errorf("a record of transport %s contains the secret value %q", c.Transport, v)
			}
		}
	}
	// Structurally: no type reachable from Record is Secrets.
	if path := findType(reflect.TypeFor[Record](), reflect.TypeFor[Secrets](), "Record", map[reflect.Type]bool{}); path != "" {
		t.Errorf("Record reaches Secrets via %s", path)
	}
}

// findType returns the field path from t to a field of type target, or "".
func findType(t, target reflect.Type, path string, seen map[reflect.Type]bool) string {
	if t == target {
		return path
	}
	if seen[t] {
		return ""
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		return findType(t.Elem(), target, path+"[]", seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if p := findType(f.Type, target, path+"."+f.Name, seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// TestStore_RefusesASecretTheProcessHasSeen: a record that would hold the
// value of a password the process was given (in a path, a mount flag) is
// not written, and the error names the kind of secret, never the value;
// a user name (an identity, sent in the clear at every iSCSI login) does
// not refuse a record.
func TestStore_RefusesASecretTheProcessHasSeen(t *testing.T) {
	const pass = "store-test-pass-9f2c"
	scrub.Add(scrub.CHAPPassword, pass)
	scrub.Add(scrub.CHAPUser, "store-test-user-9f2c")
	s := newTestStore(t)
	r := testRecord("nvme-tcp")
	r.MountFlags = []string{"opt=" + pass}
	r.AccessType = AccessMount
	err := s.Put(r)
	if !errors.Is(err, ErrHoldsSecret) || strings.Contains(err.Error(), pass) || !strings.Contains(err.Error(), string(scrub.CHAPPassword)) {
		t.Fatalf("Put = %v; want ErrHoldsSecret naming the kind, not the value", err)
	}
	if _, err := s.Get(r.VolumeID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a record was written: %v", err)
	}
	r.MountFlags = []string{"opt=store-test-user-9f2c"}
	if err := s.Put(r); err != nil {
		t.Fatalf("a user name refused the record: %v", err)
	}
}
