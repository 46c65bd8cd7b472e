package fabrics

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// HostIdentity is the NVMe host NQN and host ID this node presents.
type HostIdentity struct {
	NQN string
	ID  string
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// LoadOrCreateHostIdentity reads the host NQN and host ID from nqnPath and
// idPath (normally /etc/nvme/hostnqn and /etc/nvme/hostid). When absent it
// generates them (a random UUID, the NQN in the nvmexpress uuid form) and
// persists them atomically, so every later connect — from pathmend or any
// other tool on the node — presents the same identity. A present but
// malformed file is an error, never silently replaced: target ACLs are
// keyed on it.
func LoadOrCreateHostIdentity(nqnPath, idPath string) (HostIdentity, error) {
	nqn, nqnErr := readTrimmed(nqnPath)
	id, idErr := readTrimmed(idPath)
	if nqnErr != nil && !errors.Is(nqnErr, os.ErrNotExist) {
		return HostIdentity{}, nqnErr
	}
	if idErr != nil && !errors.Is(idErr, os.ErrNotExist) {
		return HostIdentity{}, idErr
	}
	if id == "" {
		// Reuse the UUID of a uuid-form host NQN, as nvme-cli does.
		if u, ok := strings.CutPrefix(nqn, "nqn.2014-08.org.nvmexpress:uuid:"); ok && uuidRE.MatchString(u) {
			id = u
		} else {
			u, err := newUUID()
			if err != nil {
				return HostIdentity{}, err
			}
			id = u
		}
		if err := writeAtomic(idPath, id+"\n"); err != nil {
			return HostIdentity{}, err
		}
	}
	if !uuidRE.MatchString(strings.ToLower(id)) {
		return HostIdentity{}, fmt.Errorf("%s: host ID %q is not a UUID", idPath, id)
	}
	if nqn == "" {
		nqn = "nqn.2014-08.org.nvmexpress:uuid:" + strings.ToLower(id)
		if err := writeAtomic(nqnPath, nqn+"\n"); err != nil {
			return HostIdentity{}, err
		}
	}
	if !strings.HasPrefix(nqn, "nqn.") || strings.ContainsAny(nqn, ", \t") || len(nqn) > 223 {
		return HostIdentity{}, fmt.Errorf("%s: host NQN %q is malformed", nqnPath, nqn)
	}
	return HostIdentity{NQN: nqn, ID: strings.ToLower(id)}, nil
}

func readTrimmed(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

func writeAtomic(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}
