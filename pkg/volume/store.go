package volume

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/pkg/scrub"
)

const (
	// recordsDir is the subdirectory of the store directory holding records;
	// keeping them apart leaves room for other state next to them.
	recordsDir = "volumes"
	// recordPrefix and recordSuffix frame the hash in a record file name.
	recordPrefix = "vol-"
	recordSuffix = ".json"
	// tmpPrefix starts every temporary and probe file. List skips anything
	// that is not a record name, so a crash that leaves one behind hides no
	// record and corrupts none.
	tmpPrefix = ".tmp-"
	// maxRecordSize bounds one read, and Put refuses to write a record
	// larger than that, so a record can never be written that Get cannot
	// read back. A real record is about a kilobyte; the largest one the
	// driver's request limits admit (CSI's 128-byte volume ID, 4 KiB maps
	// and mount flags, 4096-byte paths, MaxPublications publications, every
	// path character escaped) is about 2.2 MiB.
	maxRecordSize = 4 << 20
)

// Store keeps one Record per staged volume as a JSON file on disk. The
// files are the truth across plugin restarts: every call looks at the
// disk. What it keeps in memory is only the last parse of each record
// file, under the identity of the file it was read from (device, inode,
// size, modification and change time, from one stat): a file with that
// identity is the same bytes, so it is not read and decoded again — a
// Put replaces the file (a new inode), and any other change of it moves
// its change time. Callers get a copy of a record; a Store is safe for
// concurrent use on
// different volume IDs; calls for the same volume ID must be serialized by
// the caller (the driver's per-volume lock), otherwise the last Put wins.
// The zero Store is not usable; create one with NewStore.
type Store struct {
	dir     string
	records string

	mu     sync.Mutex
	parsed map[string]parsedRecord // record file path → its last parse

	// gen counts the Puts and Deletes this Store has made (Generation).
	gen atomic.Uint64
}

// Generation counts the Puts and Deletes of records this Store made,
// successful or not: an answer derived from a Scan begun at generation g
// still holds while Generation returns g — the process writes its records
// through its one Store, and nothing else writes them.
func (s *Store) Generation() uint64 { return s.gen.Load() }

// parsedRecord is the last parse of a record file and the identity of the
// file it was read from.
type parsedRecord struct {
	id  fileID
	rec Record
}

// fileID tells one version of a file from every other: device and inode
// number (a rename over it is another inode), size, and modification and
// change times (a write in place moves both).
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func fileIDOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// NewStore returns a store kept under dir, which must be an absolute path.
// It creates dir and its records subdirectory with mode 0700 when missing
// (fsyncing each parent it changed, so the directories survive a crash
// together with the first record), and reads nothing.
func NewStore(dir string) (*Store, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("staged-volume store directory %q: must be an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	records := filepath.Join(dir, recordsDir)
	if err := mkdirDurable(records); err != nil {
		return nil, fmt.Errorf("create staged-volume store: %w", err)
	}
	return &Store{dir: dir, records: records, parsed: map[string]parsedRecord{}}, nil
}

// Dir is the directory the store was created with.
func (s *Store) Dir() string { return s.dir }

// Put writes r atomically: to a temporary file in the records directory,
// fsynced, renamed over the previous record and followed by an fsync of the
// directory. After a crash the record is either the old or the new one,
// never a mix. The file mode is 0600. An error after the rename (the
// directory fsync) leaves the new record in place but not yet durable.
// The record is written with Version RecordVersion. Put rejects a
// record without VolumeID (or not valid UTF-8), with an unknown State or
// AccessType,
// with file system settings on a block volume, with an empty or repeated
// publication target path or more than MaxPublications of them, with a
// path that is not valid UTF-8, whose Context Parse would not have
// produced, or whose encoding is larger than Get reads: a record is never
// written that Get could not read back.
func (s *Store) Put(r Record) error {
	if err := r.check(); err != nil {
		return fmt.Errorf("put staged-volume record: %w", err)
	}
	r.Version = RecordVersion
	data, err := encodeRecord(r)
	if err != nil {
		return fmt.Errorf("put staged-volume record %q: encode: %w", r.VolumeID, err)
	}
	if len(data) > maxRecordSize {
		return fmt.Errorf("put staged-volume record %q: encodes to %d bytes; the store reads at most %d", r.VolumeID, len(data), maxRecordSize)
	}

	name := recordName(r.VolumeID)
	defer s.gen.Add(1)
	if err := s.writeAtomic(name, data); err != nil {
		return fmt.Errorf("put staged-volume record %q: %w", r.VolumeID, err)
	}
	return nil
}

// encodeRecord renders a record as indented JSON with a final newline.
// HTML escaping is off: it would spell each '<', '>' and '&' of a path in
// six bytes, for no reader that needs it.
func encodeRecord(r Record) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (s *Store) writeAtomic(name string, data []byte) error {
	return writeAtomic(s.records, name, data)
}

// ErrHoldsSecret is wrapped by every write of a state file that would
// hold the value of a password or key the process has seen (scrub.Default
// knows them): the file is not written.
var ErrHoldsSecret = errors.New("would hold a secret value")

// writeAtomic writes dir/name through a fsynced temporary file, a rename
// and an fsync of dir. It refuses data that holds a secret the process
// has seen, naming its kind, never the value.
func writeAtomic(dir, name string, data []byte) (err error) {
	if kind, ok := scrub.Default.Find(data); ok {
		return fmt.Errorf("%s %w (a %s this process was given); not written", name, ErrHoldsSecret, kind)
	}
	// os.CreateTemp opens with O_EXCL and mode 0600.
	tmp, err := os.CreateTemp(dir, tmpPrefix+name+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

// stampsDir holds node-wide times the heal remembers across restarts.
const stampsDir = "stamps"

// SetStamp records time t under name (lower-case letters, digits and
// dashes), atomically like a record: <dir>/stamps/<name> holds it as
// RFC 3339 text. The iSCSI heal stamps its last iscsid restart there, so
// a restarted pathmend keeps the once-per-window budget.
func (s *Store) SetStamp(name string, t time.Time) error {
	if err := checkStampName(name); err != nil {
		return err
	}
	dir := filepath.Join(s.dir, stampsDir)
	if err := mkdirDurable(dir); err != nil {
		return fmt.Errorf("stamp %s: %w", name, err)
	}
	if err := writeAtomic(dir, name, []byte(t.UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return fmt.Errorf("stamp %s: %w", name, err)
	}
	return nil
}

// Stamp returns the time recorded under name; ok is false when there is
// none. An unreadable or malformed stamp is an error naming the file.
func (s *Store) Stamp(name string) (t time.Time, ok bool, err error) {
	if err := checkStampName(name); err != nil {
		return time.Time{}, false, err
	}
	path := filepath.Join(s.dir, stampsDir, name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("stamp %s: %w", path, err)
	}
	t, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("stamp %s: %w", path, err)
	}
	return t, true, nil
}

func checkStampName(name string) error {
	ok := name != "" && len(name) <= 64
	for _, r := range name {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}
	if !ok {
		return fmt.Errorf("stamp name %q: want lower-case letters, digits and dashes", name)
	}
	return nil
}

// RecordPath is the file that holds (or would hold) the record of
// volumeID, for messages and for an operator.
func (s *Store) RecordPath(volumeID string) string {
	return filepath.Join(s.records, recordName(volumeID))
}

// Get returns the record of volumeID. A missing record is an error wrapping
// ErrNotFound; an unreadable, corrupt, foreign or newer record is a
// *RecordError naming the file (wrapping ErrUnreadableRecord), never
// ErrNotFound.
func (s *Store) Get(volumeID string) (Record, error) {
	path := filepath.Join(s.records, recordName(volumeID))
	r, err := s.read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, fmt.Errorf("volume %q: %w", volumeID, ErrNotFound)
	}
	if err != nil {
		return Record{}, err
	}
	// Only a SHA-256 prefix collision or a file copied by hand gets here.
	if r.VolumeID != volumeID {
		return Record{}, &RecordError{Path: path, VolumeID: r.VolumeID, Target: r.Target(), Err: fmt.Errorf("holds volume %q, not %q", r.VolumeID, volumeID)}
	}
	return r, nil
}

// Delete removes the record of volumeID and fsyncs the directory. Deleting
// a record that does not exist succeeds, so NodeUnstage can be retried.
func (s *Store) Delete(volumeID string) error {
	defer s.gen.Add(1)
	path := filepath.Join(s.records, recordName(volumeID))
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("delete staged-volume record %q: %w", volumeID, err)
	}
	if err := syncDir(s.records); err != nil {
		return fmt.Errorf("delete staged-volume record %q: %w", volumeID, err)
	}
	return nil
}

// List returns every readable record, sorted by VolumeID. A corrupt record
// does not hide the others: List returns what it could read together with
// an errors.Join of one error per bad file (nil when there is none).
// Temporary files left by an interrupted Put are ignored. Only a failure
// to read the directory itself returns no records.
func (s *Store) List() ([]Record, error) {
	l, err := s.Scan()
	if err != nil {
		return nil, err
	}
	return l.Records, l.Err()
}

// Scan reads every record file: the records it could read, sorted by
// VolumeID, and a *RecordError per file it could not (with the volume and
// target the file's envelope names, when it names them), sorted by path.
// Temporary files left by an interrupted Put are ignored. The error is
// only a failure to read the directory itself.
func (s *Store) Scan() (Listing, error) {
	entries, err := os.ReadDir(s.records)
	if err != nil {
		return Listing{}, fmt.Errorf("list staged-volume records: %w", err)
	}
	var l Listing
	seen := make(map[string]bool, len(entries))
	defer s.prune(seen)
	for _, e := range entries {
		if !isRecordName(e.Name()) {
			continue
		}
		path := filepath.Join(s.records, e.Name())
		seen[path] = true
		r, err := s.read(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since the directory was read
		}
		if err == nil && recordName(r.VolumeID) != e.Name() {
			err = &RecordError{Path: path, VolumeID: r.VolumeID, Target: r.Target(),
				Err: fmt.Errorf("holds volume %q, whose record is %s", r.VolumeID, recordName(r.VolumeID))}
		}
		var re *RecordError
		switch {
		case errors.As(err, &re):
			l.Unreadable = append(l.Unreadable, re)
		case err != nil:
			l.Unreadable = append(l.Unreadable, &RecordError{Path: path, Err: err})
		default:
			l.Records = append(l.Records, r)
		}
	}
	slices.SortFunc(l.Records, func(a, b Record) int { return strings.Compare(a.VolumeID, b.VolumeID) })
	slices.SortFunc(l.Unreadable, func(a, b *RecordError) int { return strings.Compare(a.Path, b.Path) })
	return l, nil
}

// Writable checks that records can be written, for the Probe RPC and
// /healthz, without writing: the records directory must be writable by
// this process (access(2) W_OK, which also fails on a read-only mount) and
// its file system must have a free block and, where it counts inodes, a
// free inode. It creates no file, so a probe every second costs two
// system calls; a disk that fails its writes shows in the next Put, which
// NodeStage reports.
func (s *Store) Writable() error {
	if err := unix.Access(s.records, unix.W_OK); err != nil {
		return fmt.Errorf("staged-volume store not writable: %s: %w", s.records, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.records, &st); err != nil {
		return fmt.Errorf("staged-volume store not writable: statfs %s: %w", s.records, err)
	}
	switch {
	case st.Flags&unix.ST_RDONLY != 0:
		return fmt.Errorf("staged-volume store not writable: %s is on a read-only file system", s.records)
	case st.Bfree == 0:
		return fmt.Errorf("staged-volume store not writable: the file system of %s is full", s.records)
	case st.Files > 0 && st.Ffree == 0:
		return fmt.Errorf("staged-volume store not writable: the file system of %s has no free inode", s.records)
	}
	return nil
}

// envelope is the part of a record every version keeps at the same JSON
// paths (see RecordVersion): enough to tell whose record an unreadable
// file is.
type envelope struct {
	Version  int    `json:"version"`
	VolumeID string `json:"volumeID"`
	Context  struct {
		Transport Transport `json:"transport"`
		NVMe      *struct {
			NQN string `json:"nqn"`
		} `json:"nvme"`
		ISCSI *struct {
			IQN string `json:"iqn"`
		} `json:"iscsi"`
	} `json:"context"`
}

func (e envelope) target() Target {
	c := e.Context
	switch {
	case c.Transport == TransportNVMeTCP && c.NVMe != nil && c.NVMe.NQN != "":
		return Target{Transport: c.Transport, Name: c.NVMe.NQN}
	case c.Transport == TransportISCSI && c.ISCSI != nil && c.ISCSI.IQN != "":
		return Target{Transport: c.Transport, Name: c.ISCSI.IQN}
	}
	return Target{}
}

// read is readRecordID of path, through the last parse of the file when
// the file is the one it was read from; it returns a copy.
func (s *Store) read(path string) (Record, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		s.mu.Lock()
		p, ok := s.parsed[path]
		s.mu.Unlock()
		if ok && p.id == fileIDOf(&st) {
			return p.rec.Clone(), nil
		}
	}
	r, id, err := readRecordID(path)
	s.mu.Lock()
	if err == nil {
		s.parsed[path] = parsedRecord{id: id, rec: r.Clone()}
	} else {
		delete(s.parsed, path)
	}
	s.mu.Unlock()
	return r, err
}

// prune forgets the parses of the files a Scan did not list.
func (s *Store) prune(listed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.parsed {
		if !listed[p] {
			delete(s.parsed, p)
		}
	}
}

// readRecordID reads and decodes one record file and returns it with the
// identity of the file it read. A file that does not exist is an error
// wrapping fs.ErrNotExist; every other failure is a *RecordError naming
// the file, with the volume and target its envelope names when it can be
// decoded that far.
func readRecordID(path string) (Record, fileID, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, fileID{}, err
	}
	if err != nil {
		return Record{}, fileID{}, &RecordError{Path: path, Err: err}
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Record{}, fileID{}, &RecordError{Path: path, Err: err}
	}
	r, err := decodeRecord(path, f)
	return r, fileIDOf(&st), err
}

// decodeRecord reads and decodes the record file f at path.
func decodeRecord(path string, f io.Reader) (Record, error) {
	data, err := io.ReadAll(io.LimitReader(f, maxRecordSize+1))
	if err != nil {
		return Record{}, &RecordError{Path: path, Err: err}
	}
	if len(data) > maxRecordSize {
		return Record{}, &RecordError{Path: path, Err: fmt.Errorf("larger than %d bytes", maxRecordSize)}
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return Record{}, &RecordError{Path: path, Err: fmt.Errorf("corrupt: %w", err)}
	}
	bad := func(err error) (Record, error) {
		return Record{}, &RecordError{Path: path, VolumeID: env.VolumeID, Target: env.target(), Err: err}
	}
	switch {
	case env.Version <= 0:
		return bad(errors.New("corrupt: no version"))
	case env.Version > RecordVersion:
		return bad(fmt.Errorf("written by a newer pathmend (version %d); this pathmend reads versions up to %d", env.Version, RecordVersion))
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return bad(fmt.Errorf("corrupt: %w", err))
	}
	if r.VolumeID == "" {
		return bad(errors.New("corrupt: no volume ID"))
	}
	if r.Version == 1 {
		// Version 1 knew no states: a record was written when NodeStage
		// had succeeded.
		if r.State != "" {
			return bad(fmt.Errorf("corrupt: version 1 with state %q", r.State))
		}
		r.State, r.StateSince = StateStaged, r.StagedAt
	}
	if !r.State.Known() {
		return bad(fmt.Errorf("corrupt: unknown state %q", r.State))
	}
	return r, nil
}

// recordName maps a volume ID to its file name. Volume IDs are arbitrary
// UTF-8 up to 128 bytes and may contain '/', "..", or anything else unfit
// for a path, so the name is a hash; 128 bits make a collision impossible
// in practice, and Get still verifies the ID stored inside.
func recordName(volumeID string) string {
	return HashedName(recordPrefix, volumeID, recordSuffix)
}

// isRecordName reports whether name has the exact shape recordName produces.
func isRecordName(name string) bool {
	return IsHashedName(name, recordPrefix, recordSuffix)
}

// HashedName is the file name of key in a state directory: prefix, the
// first 16 bytes of the SHA-256 of key in hex, suffix. Keys (volume IDs,
// NQNs) may hold anything unfit for a path; 128 bits make a collision
// impossible in practice, and readers verify the key stored inside.
func HashedName(prefix, key, suffix string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + hex.EncodeToString(sum[:16]) + suffix
}

// IsHashedName reports whether name has the exact shape HashedName
// produces with prefix and suffix.
func IsHashedName(name, prefix, suffix string) bool {
	h, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	h, ok = strings.CutSuffix(h, suffix)
	return ok && len(h) == 32 && strings.Trim(h, "0123456789abcdef") == ""
}

// mkdirDurable creates dir and any missing parents with mode 0700, fsyncing
// the parent of every directory it creates.
func mkdirDurable(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirDurable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

// syncDir fsyncs a directory so that creations, renames and removals in it
// are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil {
		return fmt.Errorf("fsync %s: %w", dir, serr)
	}
	if cerr != nil {
		return fmt.Errorf("close %s: %w", dir, cerr)
	}
	return nil
}

// WriteFileAtomic writes dir/name the way a record is written: through a
// fsynced temporary file (mode 0600) named with the ".tmp-" prefix, a
// rename and an fsync of dir. Other kinds of state kept in the state
// directory (companion mode's learned subsystems) use it so that a crash
// leaves the old file or the new one, never a mix.
func WriteFileAtomic(dir, name string, data []byte) error { return writeAtomic(dir, name, data) }

// MkdirDurable creates dir and its missing parents with mode 0700,
// fsyncing the parent of each directory it creates.
func MkdirDurable(dir string) error { return mkdirDurable(dir) }

// RemoveDurable removes dir/name and fsyncs dir; a file already gone is
// not an error.
func RemoveDurable(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return syncDir(dir)
}
