//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/kmsg"
)

// fsWatch follows one mounted filesystem across a heal: the kernel log
// from before the fault on, and a file written and fsync'd before it. A
// heal that left the filesystem read-only, shut down or without the file's
// data fails the test, whether or not the heal's own checks passed.
type fsWatch struct {
	mnt    string
	dev    string // the block device's kernel name: "dm-0", "nvme0n1"
	cursor uint64 // the kernel log's newest record when the watch began
	proof  []byte
	start  time.Time
}

// watchFS takes the kernel log's cursor and writes a random 1 MiB file
// with fsync to the filesystem mounted at mnt.
func watchFS(t *testing.T, mnt string) *fsWatch {
	t.Helper()
	src, err := mountSource(mnt)
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		t.Fatalf("resolve %s, mounted at %s: %v", src, mnt, err)
	}
	cur, err := kmsg.Cursor(kmsg.Path)
	if err != nil {
		t.Fatalf("kernel log: %v", err)
	}
	w := &fsWatch{mnt: mnt, dev: filepath.Base(real), cursor: cur, proof: make([]byte, 1<<20), start: time.Now()}
	if _, err := rand.Read(w.proof); err != nil {
		t.Fatal(err)
	}
	if err := writeDurable(filepath.Join(mnt, "fswatch-proof"), w.proof); err != nil {
		t.Fatalf("write the proof file before the fault: %v", err)
	}
	return w
}

// writeDurable writes b to path and fsyncs the file and its directory.
func writeDurable(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// fsErrorLine reports whether a kernel message says that the filesystem
// on dev lost writes or stopped taking them.
func fsErrorLine(msg, dev string) bool {
	for _, pat := range []string{
		"EXT4-fs error (device " + dev + ")",
		"EXT4-fs (" + dev + "): Remounting filesystem read-only",
		"EXT4-fs (" + dev + "): I/O error",
		"EXT4-fs warning (device " + dev + ")",
		"Buffer I/O error on dev " + dev + ",",
		"XFS (" + dev + "): ",
	} {
		if strings.Contains(msg, pat) {
			return true
		}
	}
	// "JBD2: Detected IO errors while flushing file data on dm-0-8"
	return strings.HasPrefix(msg, "JBD2: ") && strings.Contains(msg, " "+dev+"-")
}

// kernelLines returns what the kernel logged since the watch began.
func (w *fsWatch) kernelLines(t *testing.T) []kmsg.Record {
	t.Helper()
	rs, err := kmsg.Since(kmsg.Path, w.cursor)
	if err != nil {
		t.Errorf("kernel log: %v", err)
	}
	return rs
}

// mountEntry returns the mount options (per mount, then the
// superblock's) and the source of the visible mount at mnt, from
// /proc/self/mountinfo.
func mountEntry(mnt string) (opts, source string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 10 || fields[4] != mnt {
			continue
		}
		sep := 6
		for sep < len(fields) && fields[sep] != "-" {
			sep++
		}
		if sep+3 >= len(fields) {
			continue
		}
		// The last mount at mnt is the visible one.
		opts, source = fields[5]+" "+fields[sep+3], fields[sep+2]
	}
	if source == "" {
		return "", "", fmt.Errorf("%s is not a mount point", mnt)
	}
	return opts, source, s.Err()
}

func mountOptions(mnt string) (string, error) {
	o, _, err := mountEntry(mnt)
	return o, err
}

func mountSource(mnt string) (string, error) {
	_, s, err := mountEntry(mnt)
	return s, err
}

// assertIntact fails the test unless the filesystem is still mounted
// read-write, takes a new fsync'd write that reads back, still holds the
// proof file (read after dropping the page cache, so from the device),
// and the kernel logged no filesystem error about its device since the
// watch began. It logs the kernel's storage lines of that time either way,
// with their times relative to the watch.
func (w *fsWatch) assertIntact(t *testing.T, l lab) {
	t.Helper()
	w.logKernel(t)
	if opts, err := mountOptions(w.mnt); err != nil {
		t.Errorf("after the heal: %v", err)
	} else if strings.HasPrefix(opts, "ro") || strings.Contains(opts, " ro,") || strings.HasSuffix(opts, " ro") {
		t.Errorf("after the heal %s (%s) is mounted read-only: %s", w.mnt, w.dev, opts)
	}
	fresh := make([]byte, 64<<10)
	_, _ = rand.Read(fresh)
	probe := filepath.Join(w.mnt, "fswatch-after")
	if err := writeDurable(probe, fresh); err != nil {
		t.Errorf("after the heal, a write + fsync to %s failed: %v", w.mnt, err)
	}
	l.sh(t, "echo 3 >/proc/sys/vm/drop_caches")
	if got, err := os.ReadFile(filepath.Join(w.mnt, "fswatch-proof")); err != nil || !bytes.Equal(got, w.proof) {
		t.Errorf("after the heal, the file written before the fault reads back %d of %d bytes, equal %v, %v", len(got), len(w.proof), bytes.Equal(got, w.proof), err)
	}
	if got, err := os.ReadFile(probe); err != nil || !bytes.Equal(got, fresh) {
		t.Errorf("after the heal, the file written after it reads back %d of %d bytes, %v", len(got), len(fresh), err)
	}
	for _, r := range w.kernelLines(t) {
		if fsErrorLine(r.Msg, w.dev) {
			t.Errorf("the kernel logged a filesystem error on %s: %s", w.dev, r)
		}
	}
}

// logKernel logs the storage lines the kernel wrote since the watch began.
func (w *fsWatch) logKernel(t *testing.T) {
	t.Helper()
	var b strings.Builder
	for _, r := range w.kernelLines(t) {
		if storageLine(r.Msg) {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	if b.Len() > 0 {
		t.Logf("kernel storage lines since the watch on %s began (guest uptime):\n%s", w.dev, b.String())
	}
}

// storageLine reports whether a kernel message is about block storage,
// its transports or a filesystem.
func storageLine(msg string) bool {
	for _, p := range []string{"EXT4", "XFS", "JBD2", "Buffer I/O", "I/O error", "device-mapper", "multipath", "nvme", "connection", "session", "sd ", "scsi", "blk_update", "iscsi"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// uptime returns the guest's time since boot, the clock of kernel log lines.
func uptime(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	var secs float64
	if _, err := fmt.Sscanf(string(b), "%f", &secs); err != nil {
		t.Fatal(err)
	}
	return time.Duration(secs * float64(time.Second))
}

// fsyncWriter appends 4 KiB and fsyncs, every 500 ms, to a file on a
// filesystem under test, so an outage meets I/O in flight: a write queued
// while every path is down must complete once a path is back.
type fsyncWriter struct {
	once    sync.Once
	done    chan struct{}
	stopped chan struct{}
	writes  int
	errs    []error
	slowest time.Duration
}

func startFsyncWriter(t *testing.T, mnt string) *fsyncWriter {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(mnt, "fswatch-writer"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := &fsyncWriter{done: make(chan struct{}), stopped: make(chan struct{})}
	// A test that fails before stop still ends the writer.
	t.Cleanup(func() { w.once.Do(func() { close(w.done) }) })
	buf := bytes.Repeat([]byte("w"), 4096)
	go func() {
		defer close(w.stopped)
		defer f.Close()
		for {
			start := time.Now()
			_, err := f.Write(buf)
			if err == nil {
				err = f.Sync()
			}
			w.writes++
			w.slowest = max(w.slowest, time.Since(start))
			if err != nil && len(w.errs) < 10 {
				w.errs = append(w.errs, err)
			}
			select {
			case <-w.done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

// stop ends the writer after its write in flight and fails the test if
// any write or fsync failed.
func (w *fsyncWriter) stop(t *testing.T) {
	t.Helper()
	w.once.Do(func() { close(w.done) })
	select {
	case <-w.stopped:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the writer's write + fsync did not return within 3 min of the heal")
	}
	t.Logf("writer: %d writes + fsyncs, the slowest %s", w.writes, w.slowest.Round(100*time.Millisecond))
	for _, err := range w.errs {
		t.Errorf("a write + fsync during the outage failed: %v", err)
	}
}

// queueWindow is how long dm-multipath queues I/O for the map of dev with
// every path down: its no_path_retry (multipathd's "N chk") times the
// checker's polling_interval. It fails the test when the map does not
// queue for a bounded time.
func queueWindow(t *testing.T, l lab, dev string) time.Duration {
	t.Helper()
	real, err := filepath.EvalSymlinks(dev)
	if err != nil {
		t.Fatal(err)
	}
	q := l.sh(t, `multipathd show maps raw format "%d %Q" | awk -v d=`+filepath.Base(real)+` '$1 == d { print $2, $3 }'`)
	var checks int
	if _, err := fmt.Sscanf(q, "%d chk", &checks); err != nil {
		t.Fatalf("the map %s queues %q, want a bounded no_path_retry (\"N chk\")", real, q)
	}
	pi := l.sh(t, `multipathd show config local | awk '$1 == "polling_interval" { print $2; exit }'`)
	var secs int
	if _, err := fmt.Sscanf(pi, "%d", &secs); err != nil || secs <= 0 {
		t.Fatalf("multipathd polling_interval %q", pi)
	}
	w := time.Duration(checks*secs) * time.Second
	t.Logf("dm-multipath queues %s's I/O for %d checks × %d s = %s with every path down", real, checks, secs, w)
	return w
}
