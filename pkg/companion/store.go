package companion

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pathmend/pathmend/pkg/volume"
)

const (
	learnedDir    = "learned"
	learnedPrefix = "sub-"
	learnedSuffix = ".json"
	// maxLearnedSize bounds one file read; a file is never written
	// larger.
	maxLearnedSize = 256 << 10
	// MaxEndpoints bounds the endpoints learned per subsystem.
	MaxEndpoints = 64
)

// Store keeps one file per learned subsystem under <state-dir>/learned,
// written atomically (volume.WriteFileAtomic: temporary file, fsync,
// rename, directory fsync; mode 0600). Only the companion's tick writes
// it; it is not safe for concurrent writers.
type Store struct {
	dir string
}

// NewStore returns the store of stateDir (an absolute path), creating
// its learned directory with mode 0700 when missing.
func NewStore(stateDir string) (*Store, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("learned-subsystem store %q: must be an absolute path", stateDir)
	}
	dir := filepath.Join(filepath.Clean(stateDir), learnedDir)
	if err := volume.MkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("create learned-subsystem store: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the directory of the learned files.
func (s *Store) Dir() string { return s.dir }

// Unreadable is a learned file that cannot be read. Nothing of the
// subsystem it names is done while it exists (fail closed): a newer
// pathmend may know more about it than this one.
type Unreadable struct {
	Path string
	// NQN is the subsystem the file's envelope names; "" when unknown.
	NQN string
	Err error
}

func (u Unreadable) Error() string { return u.Path + ": " + u.Err.Error() }

// Load reads every learned file. A file that cannot be read (a newer
// version, corrupt JSON, unreadable) is listed in unreadable with the NQN
// its envelope names when it names one.
func (s *Store) Load() (subs map[string]Subsystem, unreadable []Unreadable, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list learned subsystems: %w", err)
	}
	subs = map[string]Subsystem{}
	for _, e := range entries {
		if !isLearnedName(e.Name()) {
			continue // a write in progress, or not ours
		}
		p := filepath.Join(s.dir, e.Name())
		sub, nqn, err := readLearned(p)
		if err != nil {
			unreadable = append(unreadable, Unreadable{Path: p, NQN: nqn, Err: err})
			continue
		}
		if learnedName(sub.NQN) != e.Name() {
			unreadable = append(unreadable, Unreadable{Path: p, NQN: sub.NQN, Err: errors.New("file name does not match its NQN")})
			continue
		}
		subs[sub.NQN] = sub
	}
	return subs, unreadable, nil
}

// readLearned reads one file; nqn is the envelope's NQN when the JSON
// could be decoded that far.
func readLearned(p string) (Subsystem, string, error) {
	f, err := os.Open(p)
	if err != nil {
		return Subsystem{}, "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLearnedSize+1))
	if err != nil {
		return Subsystem{}, "", err
	}
	if len(b) > maxLearnedSize {
		return Subsystem{}, "", fmt.Errorf("larger than %d bytes", maxLearnedSize)
	}
	var env struct {
		Version int    `json:"version"`
		NQN     string `json:"nqn"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return Subsystem{}, "", fmt.Errorf("not a learned subsystem: %w", err)
	}
	if env.Version > LearnedVersion {
		return Subsystem{}, env.NQN, fmt.Errorf("written by a newer pathmend (version %d); this pathmend reads versions up to %d", env.Version, LearnedVersion)
	}
	if env.Version < 1 {
		return Subsystem{}, env.NQN, fmt.Errorf("version %d is not a learned-subsystem version", env.Version)
	}
	var sub Subsystem
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sub); err != nil {
		return Subsystem{}, env.NQN, fmt.Errorf("decode: %w", err)
	}
	if err := sub.check(); err != nil {
		return Subsystem{}, env.NQN, err
	}
	return sub, sub.NQN, nil
}

// check validates a subsystem before it is written and after it is read.
func (s *Subsystem) check() error {
	if s.NQN == "" || len(s.NQN) > 223 || strings.ContainsAny(s.NQN, ", \t\n\r=") {
		return fmt.Errorf("invalid NQN %q", s.NQN)
	}
	if len(s.Endpoints) > MaxEndpoints {
		return fmt.Errorf("%d endpoints; at most %d are learned", len(s.Endpoints), MaxEndpoints)
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if e.Transport != "tcp" || e.Traddr == "" || e.Trsvcid == "" {
			return fmt.Errorf("endpoint %q: not an NVMe/TCP endpoint", e.String())
		}
		if err := e.Options(s.NQN).Check(); err != nil {
			return fmt.Errorf("endpoint %s: %w", e.String(), err)
		}
	}
	return nil
}

// Put writes sub (as version LearnedVersion) atomically.
func (s *Store) Put(sub Subsystem) error {
	sub.Version = LearnedVersion
	if err := sub.check(); err != nil {
		return fmt.Errorf("put learned subsystem: %w", err)
	}
	b, err := json.MarshalIndent(sub, "", "  ")
	if err != nil {
		return fmt.Errorf("put learned subsystem %s: %w", sub.NQN, err)
	}
	if len(b) > maxLearnedSize {
		return fmt.Errorf("put learned subsystem %s: %d bytes; at most %d are read", sub.NQN, len(b), maxLearnedSize)
	}
	if err := volume.WriteFileAtomic(s.dir, learnedName(sub.NQN), append(b, '\n')); err != nil {
		return fmt.Errorf("put learned subsystem %s: %w", sub.NQN, err)
	}
	return nil
}

// Delete forgets the subsystem nqn; one not stored is not an error.
func (s *Store) Delete(nqn string) error {
	if err := volume.RemoveDurable(s.dir, learnedName(nqn)); err != nil {
		return fmt.Errorf("forget learned subsystem %s: %w", nqn, err)
	}
	return nil
}

// Path is the file subsystem nqn is learned in.
func (s *Store) Path(nqn string) string { return filepath.Join(s.dir, learnedName(nqn)) }

// learnedName is the file name of a subsystem: NQNs hold ':' and may be
// long, so the name is the first 16 bytes of the SHA-256 of the NQN.
func learnedName(nqn string) string {
	return volume.HashedName(learnedPrefix, nqn, learnedSuffix)
}

func isLearnedName(name string) bool {
	return volume.IsHashedName(name, learnedPrefix, learnedSuffix)
}

// sortedNQNs lists the keys of subs in order.
func sortedNQNs(subs map[string]Subsystem) []string {
	nqns := make([]string, 0, len(subs))
	for n := range subs {
		nqns = append(nqns, n)
	}
	slices.Sort(nqns)
	return nqns
}
