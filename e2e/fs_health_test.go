//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fsTarget builds a subsystem with one namespace per entry of formats
// ("ext4", "xfs" or "" for blank), each on a loop device of sizeMB
// pre-formatted on the target side (ext4 without lazy initialisation, so
// no background writer of the kernel's own touches it during a test),
// reached through ports 1 (127.0.0.1:4420, optimized) and 2
// (127.0.0.1:4421, non-optimized).
func fsTarget(t *testing.T, l lab, nqn string, sizeMB int, formats ...string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "modprobe nvme_tcp\nnqn=%q\nnvmet_subsys_create \"$nqn\"\n", nqn)
	for i, f := range formats {
		nsid := i + 1
		fmt.Fprintf(&b, "dev=$(lab_loop_create e2e-fs-%d %d)\n", nsid, sizeMB)
		switch f {
		case "ext4":
			b.WriteString("mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 \"$dev\"\n")
		case "xfs":
			b.WriteString("mkfs.xfs -q -f \"$dev\"\n")
		}
		fmt.Fprintf(&b, "nvmet_ns_add \"$nqn\" %d \"$dev\" 1 \"$(lab_uuid_of \"$nqn/%d\")\"\n", nsid, nsid)
	}
	b.WriteString(`nvmet_port_create 1 127.0.0.1 4420
nvmet_port_create 2 127.0.0.1 4421
nvmet_port_ana 1 1 optimized
nvmet_port_ana 2 1 non-optimized
nvmet_port_link 1 "$nqn"
nvmet_port_link 2 "$nqn"
`)
	l.sh(t, b.String())
}

// portsDown unlinks both ports from the subsystem and waits until every
// controller of it is connecting; portsUp links them again and waits
// until they are live. The kernel's own transitions: connecting at once
// when the port goes (the connect fails -111), live ~1.5 s after it comes
// back with reconnect_delay 2 (idle); 2 minutes is a safety net above
// 50x that.
func portsDown(t *testing.T, l lab, nqn string) time.Time {
	t.Helper()
	l.sh(t, fmt.Sprintf("nvmet_port_unlink 1 %q; nvmet_port_unlink 2 %q", nqn, nqn))
	at := time.Now()
	eventually(t, 2*time.Minute, "every controller of "+nqn+" connecting", func() bool { return ctrlStates(t, nqn) == "connecting" })
	return at
}

func portsUp(t *testing.T, l lab, nqn string) time.Time {
	t.Helper()
	at := linkPorts(t, l, nqn)
	eventually(t, 2*time.Minute, "every controller of "+nqn+" live", func() bool { return ctrlStates(t, nqn) == "live" })
	return at
}

// linkPorts links both target ports of nqn again and returns when; it
// waits for nothing (after an unstage no controller of nqn is left to
// come back).
func linkPorts(t *testing.T, l lab, nqn string) time.Time {
	t.Helper()
	l.sh(t, fmt.Sprintf("nvmet_port_link 1 %q; nvmet_port_link 2 %q", nqn, nqn))
	return time.Now()
}

// ctrlStates is the state of every controller of nqn when they all have
// the same one, else "mixed".
func ctrlStates(t *testing.T, nqn string) string {
	state := ""
	for _, c := range controllersOf(t, nqn) {
		b, _ := os.ReadFile("/sys/class/nvme/" + c + "/state")
		s := strings.TrimSpace(string(b))
		if state != "" && s != state {
			return "mixed"
		}
		state = s
	}
	return state
}

// fsContext is a two-path volume context with short kernel timeouts: the
// kernel fails the queued I/O 5 s after the paths go down (fastIOFailTmo),
// the queueing window these tests outlast.
func fsContext(nqn string, nsid int) map[string]string {
	return twoPathContext(nqn, nsid, "fastIOFailTmo", "5", "reconnectDelay", "2")
}

func fsCap(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// fsVolume is one staged filesystem volume of a test.
type fsVolume struct {
	id, fsType, staging, target string
	vctx                        map[string]string
	node                        csi.NodeClient
}

func stageFS(t *testing.T, node csi.NodeClient, id, fsType string, vctx map[string]string) *fsVolume {
	t.Helper()
	dir := t.TempDir()
	v := &fsVolume{id: id, fsType: fsType, staging: filepath.Join(dir, "staging"), target: filepath.Join(dir, "pod", "mount"), vctx: vctx, node: node}
	os.MkdirAll(v.staging, 0o750)
	unmountOnCleanup(t, v.target)
	unmountOnCleanup(t, v.staging)
	v.stage(t)
	return v
}

func (v *fsVolume) stage(t *testing.T) {
	t.Helper()
	rpc(t, "NodeStageVolume "+v.id, func(ctx context.Context) error {
		_, err := v.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeContext: v.vctx, VolumeCapability: fsCap(v.fsType)})
		return err
	})
}

func (v *fsVolume) publish(t *testing.T) {
	t.Helper()
	rpc(t, "NodePublishVolume "+v.id, func(ctx context.Context) error {
		_, err := v.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: fsCap(v.fsType)})
		return err
	})
}

func (v *fsVolume) unpublish(t *testing.T) { unpublish(t, v.node, v.id, v.target) }

func (v *fsVolume) unstage(t *testing.T) {
	t.Helper()
	rpc(t, "NodeUnstageVolume "+v.id, func(ctx context.Context) error {
		_, err := v.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
		return err
	})
}

// health is NodeGetVolumeHealth's entries of v as "STATUS Reason", and
// the messages by reason.
func (v *fsVolume) health(t *testing.T) ([]string, map[string]string) {
	t.Helper()
	var out []string
	msgs := map[string]string{}
	for _, h := range volumeHealth(t, v.node, v.id) {
		out = append(out, h.GetStatus().String()+" "+h.GetReason())
		msgs[h.GetReason()] = h.GetMessage()
	}
	return out, msgs
}

// metricState is the state whose pathmend_volume_filesystem_state series
// of volume id is 1 in a scrape of addr ("" when none is).
func metricState(t *testing.T, addr, id string) string {
	t.Helper()
	re := regexp.MustCompile(`pathmend_volume_filesystem_state\{state="(\w+)",volume_id="` + regexp.QuoteMeta(id) + `"\} 1\n`)
	if m := re.FindStringSubmatch(scrape(t, addr)); m != nil {
		return m[1]
	}
	return ""
}

// blockWriter writes 64 KiB blocks, each fsync'd, into one file of a
// mounted filesystem until it is stopped; the blocks whose fsync returned
// before the first failure are durable and must all read back after the
// volume is restaged.
type blockWriter struct {
	path    string
	stopped chan struct{}
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	durable int
	err     error
	failed  time.Time
}

const blockSize = 64 << 10

// block is the content of block i: its number and a hash chain, so a
// block written in the wrong place or torn reads back different.
func block(i int) []byte {
	b := make([]byte, blockSize)
	seed := sha256.Sum256([]byte(fmt.Sprintf("pathmend block %d", i)))
	for off := 0; off < blockSize; off += len(seed) {
		copy(b[off:], seed[:])
		seed = sha256.Sum256(seed[:])
	}
	binary.BigEndian.PutUint64(b, uint64(i))
	return b
}

func startBlockWriter(t *testing.T, path string) *blockWriter {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := &blockWriter{path: path, stopped: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { w.once.Do(func() { close(w.done) }) })
	go func() {
		defer close(w.stopped)
		defer f.Close()
		// After the first failure it keeps trying the next block, as a
		// pod's writer would: each try makes the filesystem start a
		// transaction, which is when ext4 notices its aborted journal.
		// Only the blocks before the first failure count as durable.
		i := 0
		for {
			_, err := f.WriteAt(block(i), int64(i)*blockSize)
			if err == nil {
				err = f.Sync()
			}
			w.mu.Lock()
			switch {
			case err != nil && w.err == nil:
				w.err, w.failed = err, time.Now()
			case err == nil && w.err == nil:
				w.durable = i + 1
				i++
			}
			w.mu.Unlock()
			select {
			case <-w.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *blockWriter) failure() (error, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err, w.failed
}

// stop ends the writer (a write in flight returns first) and returns the
// number of durable blocks.
func (w *blockWriter) stop(t *testing.T) int {
	t.Helper()
	w.once.Do(func() { close(w.done) })
	select {
	case <-w.stopped:
	case <-time.After(3 * time.Minute):
		t.Fatal("the writer's write + fsync did not return within 3 min")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.durable
}

// verify reads the first n blocks of the file at path and fails the test
// for each that is not what was written.
func verifyBlocks(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read back %s: %v", path, err)
	}
	bad := 0
	for i := 0; i < n; i++ {
		off := i * blockSize
		if off+blockSize > len(b) || !bytes.Equal(b[off:off+blockSize], block(i)) {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of the %d blocks fsync'd before the outage do not read back (file %d bytes)", bad, n, len(b))
	} else {
		t.Logf("every one of the %d blocks fsync'd before the outage reads back", n)
	}
}

// watchHealth polls v's health until stop is closed and records every
// entry it ever saw; the co-tenant of a test must never show a
// filesystem condition.
func watchHealth(t *testing.T, v *fsVolume, every time.Duration) (seen func() map[string]int, stop func()) {
	var mu sync.Mutex
	got := map[string]int{}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			resp, err := v.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.id})
			cancel()
			mu.Lock()
			if err != nil {
				got["error: "+status.Code(err).String()]++
			} else if len(resp.GetVolumeHealth().GetHealthStatuses()) == 0 {
				got["HEALTHY"]++
			}
			for _, h := range resp.GetVolumeHealth().GetHealthStatuses() {
				got[h.GetStatus().String()+" "+h.GetReason()]++
			}
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(every):
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-finished }) }
	t.Cleanup(stop)
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, n := range got {
			out[k] = n
		}
		return out
	}, stop
}

func hasFilesystemReason(seen map[string]int) bool {
	for k := range seen {
		if strings.Contains(k, " Filesystem") {
			return true
		}
	}
	return false
}

// outageThenRestage is the scenario of the first two tests: vol (fsType,
// fastIOFailTmo 5 s) and co, its co-tenant on the same subsystem, are
// staged through pathmend; vol is published and written to by a writer
// (64 KiB blocks, each fsync'd) while both target ports go away for
// longer than the queueing window. Asserted: the writer fails once the
// kernel gives the queued I/O up; vol's filesystem is reported with
// reason (INACCESSIBLE, never HEALTHY, in NodeGetVolumeHealth and the
// metric) while the paths are down and after they are back, until the
// pods' restart path (unpublish, unstage, stage, publish) has checked and
// mounted it again; then it is healthy and writable and every block
// fsync'd before the outage reads back. The co-tenant never shows a
// filesystem condition and is HEALTHY once the paths are back.
func outageThenRestage(t *testing.T, fsType, reason, state string, port int) {
	l := needLab(t)
	l.teardownAll(t)
	nqn := "nqn.2024-01.io.pathmend.lab:e2e-fs-" + fsType
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	fsTarget(t, l, nqn, 512, fsType, "ext4")
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s", "--metrics-address="+metrics)
	node := csi.NewNodeClient(conn)
	vol := stageFS(t, node, "vol-fs", fsType, fsContext(nqn, 1))
	co := stageFS(t, node, "vol-co", "ext4", fsContext(nqn, 2))
	vol.publish(t)
	coProof := bytes.Repeat([]byte("co-tenant data\n"), 1<<14)
	if err := writeSync(filepath.Join(co.staging, "proof"), coProof); err != nil {
		t.Fatal(err)
	}
	head, _, _ := headOf(t, nqn, 1)
	// The health RPCs and the metric read the model the loop writes each
	// tick: every wait on them below is a wait for a tick or two
	// (tickLimit), not for seconds.
	eventually(t, tickLimit(2), "the metric to say vol-fs is healthy", func() bool { return metricState(t, metrics, vol.id) == "healthy" })
	if hs, _ := vol.health(t); len(hs) != 0 {
		t.Fatalf("vol-fs before the outage: %v", hs)
	}
	w := startBlockWriter(t, filepath.Join(vol.target, "blocks"))
	// 10 writes + fsyncs of a block each: ~1 s idle; 2 min is a safety net.
	eventually(t, 2*time.Minute, "10 blocks written", func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.durable >= 10 })
	coSeen, coStop := watchHealth(t, co, 500*time.Millisecond)

	down := portsDown(t, l, nqn)
	t.Logf("both ports away; every controller connecting %s later", time.Since(down).Round(100*time.Millisecond))
	// The kernel fails the queued I/O fastIOFailTmo (5 s) after the paths
	// went down; its timer work ran 1-2 s late on a loaded guest. 2 min is
	// 17x the slowest seen.
	eventually(t, 2*time.Minute, "the writer's write to fail", func() bool { err, _ := w.failure(); return err != nil })
	werr, failedAt := w.failure()
	t.Logf("the writer's write + fsync failed %s after the ports went away: %v", failedAt.Sub(down).Round(100*time.Millisecond), werr)
	var downHealth []string
	eventually(t, tickLimit(2), "vol-fs reported "+reason+" with the paths down", func() bool {
		downHealth, _ = vol.health(t)
		return strings.Contains(strings.Join(downHealth, ","), "INACCESSIBLE "+reason)
	})
	t.Logf("vol-fs with the paths down %s after the ports went away: %v", time.Since(down).Round(100*time.Millisecond), downHealth)

	up := portsUp(t, l, nqn)
	t.Logf("ports back after %s", up.Sub(down).Round(100*time.Millisecond))
	var msgs map[string]string
	eventually(t, tickLimit(2), "vol-fs's paths live again, its filesystem still reported", func() bool {
		hs, m := vol.health(t)
		msgs = m
		return len(hs) == 1 && hs[0] == "INACCESSIBLE "+reason
	})
	msg := msgs[reason]
	t.Logf("vol-fs with the paths back: INACCESSIBLE %s: %s", reason, msg)
	for _, s := range []string{fsType + " on " + head + " (", "restart the volume's pods", "docs/operations.md#pathmendfilesystemreadonly"} {
		if !strings.Contains(msg, s) {
			t.Errorf("health message lacks %q", s)
		}
	}
	if fsType == "ext4" && !regexp.MustCompile(`after \d+ errors? \(the first at 20\d\d-\d\d-\d\dT`).MatchString(msg) {
		t.Errorf("health message names no error count and first error time: %s", msg)
	}
	// Never HEALTHY until restaged: read again after each of the next
	// five monitor ticks.
	for i := range 5 {
		waitTicks(t, logPath, time.Now(), 1)
		if hs, _ := vol.health(t); len(hs) != 1 || hs[0] != "INACCESSIBLE "+reason {
			t.Fatalf("vol-fs with the paths back, not restaged, after %d more ticks: %v", i+1, hs)
		}
	}
	if got := metricState(t, metrics, vol.id); got != state {
		t.Errorf("metric state of vol-fs = %q, want %s", got, state)
	}
	if sh := storageHealth(t, node); !strings.Contains(sh["STORAGE_UNREACHABLE "+reason], "1 volume") || !strings.Contains(sh["STORAGE_UNREACHABLE "+reason], vol.id) {
		t.Errorf("storage health: %v", sh)
	}
	statsCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := node.NodeGetVolumeStats(statsCtx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.id, VolumePath: vol.target})
	cancel()
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodeGetVolumeStats of vol-fs: %v, want FailedPrecondition", err)
	}
	changed := readLog(t, logPath)
	if len(withMsg(changed, "Staged filesystem is not healthy")) == 0 {
		t.Errorf("no level-0 line says vol-fs's filesystem is not healthy")
	}

	// The co-tenant: never a filesystem condition; HEALTHY with its
	// paths back; its data intact.
	eventually(t, tickLimit(2), "vol-co healthy", func() bool { hs, _ := co.health(t); return len(hs) == 0 })
	coStop()
	seen := coSeen()
	t.Logf("vol-co's health through the outage: %v", seen)
	if hasFilesystemReason(seen) {
		t.Errorf("the co-tenant was reported with a filesystem condition: %v", seen)
	}
	// The metric is written by the tick that wrote the model; a health
	// RPC may have read the volume itself (past the model's bound) a
	// tick earlier: wait for the tick, do not read the metric once.
	eventually(t, tickLimit(2), "vol-co's metric healthy", func() bool { return metricState(t, metrics, co.id) == "healthy" })
	if b, err := os.ReadFile(filepath.Join(co.staging, "proof")); err != nil || !bytes.Equal(b, coProof) {
		t.Errorf("the co-tenant's data: %d bytes, %v", len(b), err)
	}

	// The pods' restart path.
	n := w.stop(t)
	restart := time.Now()
	vol.unpublish(t)
	vol.unstage(t)
	vol.stage(t)
	vol.publish(t)
	t.Logf("unpublish, unstage, stage, publish: %s", time.Since(restart).Round(100*time.Millisecond))
	if hs, _ := vol.health(t); len(hs) != 0 {
		t.Errorf("vol-fs after the restage: %v", hs)
	}
	eventually(t, tickLimit(2), "the metric to say vol-fs is healthy again", func() bool { return metricState(t, metrics, vol.id) == "healthy" })
	verifyBlocks(t, filepath.Join(vol.target, "blocks"), n)
	if err := writeSync(filepath.Join(vol.target, "after"), []byte("writable again")); err != nil {
		t.Errorf("a write after the restage: %v", err)
	}
	if fsType == "ext4" {
		lines := readLog(t, logPath)
		var checks []logLine
		for _, m := range []string{"Filesystem records errors: checking it before mounting", "Filesystem check corrected errors before mounting", "Filesystem check cleared the recorded errors before mounting"} {
			checks = append(checks, withMsg(lines, m)...)
		}
		if len(checks) == 0 {
			t.Errorf("no level-0 log line says the restage checked a filesystem that recorded errors")
		}
		for _, ln := range checks {
			t.Logf("check: %s", ln.Raw)
		}
	}
	vol.unpublish(t)
	vol.unstage(t)
	co.unstage(t)
}

// TestFilesystem_Ext4ReadOnlyAfterEveryPathDownUntilRestaged (issue 28,
// 4): ext4, every path down longer than the queueing window (the
// volume's fastIOFailTmo, 5 s) with writes running: ext4 aborts its
// journal and takes no writes (reason FilesystemReadOnly, metric state
// read_only), until the pods' restart path checks it (fsck -p).
func TestFilesystem_Ext4ReadOnlyAfterEveryPathDownUntilRestaged(t *testing.T) {
	outageThenRestage(t, "ext4", "FilesystemReadOnly", "read_only", 19828)
}

// TestFilesystem_XFSShutDownAfterEveryPathDownUntilRestaged (issue 28,
// 4): the same for XFS, which shuts down (FilesystemShutdown, shutdown)
// until the restage's mount replays its log.
func TestFilesystem_XFSShutDownAfterEveryPathDownUntilRestaged(t *testing.T) {
	outageThenRestage(t, "xfs", "FilesystemShutdown", "shutdown", 19829)
}

// TestFilesystem_TheFilesystemsOwnKnobsLeaveTheCoTenantHealthy (issue 28,
// 4): errors injected through each filesystem's own test knob, the paths
// untouched — ext4's /sys/fs/ext4/<dev>/trigger_fs_error on one volume,
// XFS's shutdown ioctl (xfs_io -x -c shutdown) on another — while a third
// volume on the same subsystem is read every half second: it stays
// HEALTHY throughout. Each damaged volume is reported with its reason and
// state until restaged, then healthy with its data.
func TestFilesystem_TheFilesystemsOwnKnobsLeaveTheCoTenantHealthy(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-fs-knobs"
	const metrics = "127.0.0.1:19830"
	fsTarget(t, l, nqn, 512, "ext4", "xfs", "ext4")
	conn, _ := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s", "--metrics-address="+metrics)
	node := csi.NewNodeClient(conn)
	e := stageFS(t, node, "vol-ext4", "ext4", twoPathContext(nqn, 1))
	x := stageFS(t, node, "vol-xfs", "xfs", twoPathContext(nqn, 2))
	co := stageFS(t, node, "vol-co", "ext4", twoPathContext(nqn, 3))
	data := bytes.Repeat([]byte("written before the error\n"), 1<<14)
	for _, v := range []*fsVolume{e, x} {
		v.publish(t)
		if err := writeSync(filepath.Join(v.target, "proof"), data); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, tickLimit(2), "three healthy volumes", func() bool {
		for _, v := range []*fsVolume{e, x, co} {
			if hs, _ := v.health(t); len(hs) != 0 {
				return false
			}
		}
		return true
	})
	coSeen, coStop := watchHealth(t, co, 500*time.Millisecond)
	eHead, _, _ := headOf(t, nqn, 1)
	l.sh(t, fmt.Sprintf("echo pathmend-e2e > /sys/fs/ext4/%s/trigger_fs_error", eHead))
	l.sh(t, fmt.Sprintf("xfs_io -x -c shutdown %q", x.staging))
	for _, c := range []struct {
		v             *fsVolume
		reason, state string
	}{{e, "FilesystemReadOnly", "read_only"}, {x, "FilesystemShutdown", "shutdown"}} {
		var msgs map[string]string
		eventually(t, tickLimit(2), c.v.id+" "+c.reason, func() bool {
			hs, m := c.v.health(t)
			msgs = m
			return len(hs) == 1 && hs[0] == "INACCESSIBLE "+c.reason
		})
		t.Logf("%s: INACCESSIBLE %s: %s", c.v.id, c.reason, msgs[c.reason])
		eventually(t, tickLimit(2), c.v.id+"'s metric "+c.state, func() bool { return metricState(t, metrics, c.v.id) == c.state })
	}
	if err := writeSync(filepath.Join(e.target, "after"), []byte("x")); err == nil {
		t.Errorf("a write to the ext4 after its error succeeded")
	}
	sh := storageHealth(t, node)
	t.Logf("storage health: %v", sh)
	for _, r := range []string{"FilesystemReadOnly", "FilesystemShutdown"} {
		if !strings.Contains(sh["STORAGE_UNREACHABLE "+r], "1 volume") {
			t.Errorf("storage health lacks %s for 1 volume: %v", r, sh)
		}
	}
	for _, v := range []*fsVolume{e, x} {
		v.unpublish(t)
		v.unstage(t)
		v.stage(t)
		v.publish(t)
		if hs, _ := v.health(t); len(hs) != 0 {
			t.Errorf("%s after the restage: %v", v.id, hs)
		}
		if b, err := os.ReadFile(filepath.Join(v.target, "proof")); err != nil || !bytes.Equal(b, data) {
			t.Errorf("%s's data after the restage: %d bytes, %v", v.id, len(b), err)
		}
		if err := writeSync(filepath.Join(v.target, "after"), []byte("x")); err != nil {
			t.Errorf("%s: a write after the restage: %v", v.id, err)
		}
	}
	coStop()
	seen := coSeen()
	t.Logf("the co-tenant's health, read every 500 ms throughout: %v", seen)
	if len(seen) != 1 || seen["HEALTHY"] == 0 {
		t.Errorf("the co-tenant was not HEALTHY throughout: %v", seen)
	}
	for _, v := range []*fsVolume{e, x} {
		v.unpublish(t)
		v.unstage(t)
	}
	co.unstage(t)
}

// timedRPC runs one RPC with a 3.5-minute deadline (the client deadline
// of the report) and returns its error and how long it took.
func timedRPC(f func(ctx context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 210*time.Second)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	return time.Since(start), err
}

// TestFilesystem_NoRPCWaitsWhenEveryPathIsDown (issue 28, 5): an ext4
// NVMe volume staged and published with pathmend's default connect
// options (ctrl_loss_tmo off, fast_io_fail_tmo 600), 8 MiB written and
// not synced, then both target ports gone. NodeUnpublish answers OK (the
// staging mount still holds the filesystem); NodeUnstage,
// NodeGetVolumeStats and NodeExpandVolume answer Unavailable within
// seconds naming the volume's state and its unwritten data, and start
// nothing (the staging mount stays, no unmount waits in the kernel);
// the retry answers the same. Once the ports are back, the unstage
// completes and the 8 MiB read back after a new stage. Then the runbook
// for storage gone for good: with the ports away again and unwritten data,
// the operator deletes the volume's controllers (the kernel removes the
// device and fails the queued I/O, giving that data up); the next
// NodeUnstage completes without a path.
func TestFilesystem_NoRPCWaitsWhenEveryPathIsDown(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-fs-nohang"
	fsTarget(t, l, nqn, 256, "ext4")
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(conn)
	vol := stageFS(t, node, "vol-nohang", "ext4", twoPathContext(nqn, 1))
	vol.publish(t)
	unsynced := bytes.Repeat([]byte("8 MiB not yet synced\n"), (8<<20)/21)
	if err := os.WriteFile(filepath.Join(vol.target, "unsynced"), unsynced, 0o600); err != nil {
		t.Fatal(err)
	}
	down := portsDown(t, l, nqn)
	t.Logf("both ports away; controllers connecting after %s", time.Since(down).Round(100*time.Millisecond))
	// Two monitor ticks: the node model has seen every path down (since
	// when, for the messages).
	waitTicks(t, logPath, time.Now(), 2)

	took, err := timedRPC(func(ctx context.Context) error {
		_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.id, TargetPath: vol.target})
		return err
	})
	t.Logf("timing: NodeUnpublishVolume with every path down: %s, %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Fatalf("NodeUnpublishVolume with every path down: %v", err)
	}
	calls := []struct {
		name string
		call func(ctx context.Context) error
		want []string
	}{
		{"NodeUnstageVolume", func(ctx context.Context) error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.id, StagingTargetPath: vol.staging})
			return err
		}, []string{"every path is down since 20", "mounted read-write at " + vol.staging, "not yet written", "an unmount would wait in the kernel",
			"until a path returns or NVMe fast_io_fail_tmo (600 s) expires at 20", "Nothing was started", "docs/operations.md#every-path-of-a-volume-is-down"}},
		{"NodeGetVolumeStats", func(ctx context.Context) error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.id, VolumePath: vol.staging})
			return err
		}, []string{"every path is down since 20", "a statfs would wait"}},
		{"NodeExpandVolume", func(ctx context.Context) error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.id, VolumePath: vol.staging})
			return err
		}, []string{"every path is down since 20", "a grow of the filesystem would wait"}},
		{"NodeUnstageVolume (retry)", func(ctx context.Context) error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.id, StagingTargetPath: vol.staging})
			return err
		}, []string{"every path is down since 20"}},
	}
	for _, c := range calls {
		took, err := timedRPC(c.call)
		t.Logf("timing: %s with every path down: %s, %s", c.name, took.Round(time.Millisecond), status.Code(err))
		st := status.Convert(err)
		if st.Code() != codes.Unavailable {
			t.Errorf("%s with every path down: %v, want Unavailable", c.name, err)
			continue
		}
		for _, s := range c.want {
			if !strings.Contains(st.Message(), s) {
				t.Errorf("%s: message lacks %q: %s", c.name, s, st.Message())
			}
		}
		if c.name == "NodeUnstageVolume" {
			t.Logf("NodeUnstageVolume's answer: %s", st.Message())
		}
	}
	if _, _, err := mountEntry(vol.staging); err != nil {
		t.Errorf("the staging mount is gone although nothing was to be started: %v", err)
	}
	if out, _ := l.trySh(t, 10*time.Second, "ps -eo stat,cmd | awk '$1 ~ /^D/ && /umount/' || true"); out != "" {
		t.Errorf("an unmount is waiting in the kernel: %s", out)
	}

	back := portsUp(t, l, nqn)
	var took2 time.Duration
	// Each try is an RPC that answers at once while the paths come back
	// (live ~1.5 s idle after the ports return); 2 min is a safety net.
	eventually(t, 2*time.Minute, "NodeUnstageVolume to complete with the paths back", func() bool {
		took2, err = timedRPC(calls[0].call)
		return err == nil
	})
	t.Logf("timing: NodeUnstageVolume with the paths back: %s (%s after the ports returned)", took2.Round(time.Millisecond), time.Since(back).Round(100*time.Millisecond))
	vol.stage(t)
	if b, err := os.ReadFile(filepath.Join(vol.staging, "unsynced")); err != nil || !bytes.Equal(b, unsynced) {
		t.Errorf("the 8 MiB written before the outage, not synced: %d bytes read back, %v", len(b), err)
	}

	// Gone for good: the runbook gives the unwritten data up.
	if err := os.WriteFile(filepath.Join(vol.staging, "given-up"), unsynced, 0o600); err != nil {
		t.Fatal(err)
	}
	portsDown(t, l, nqn)
	if _, err := timedRPC(calls[0].call); status.Code(err) != codes.Unavailable {
		t.Fatalf("NodeUnstageVolume with the ports away again: %v", err)
	}
	head, _, _ := headOf(t, nqn, 1)
	l.sh(t, fmt.Sprintf(`for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn)" = %q ] && echo 1 > $c/delete_controller; done; true`, nqn))
	eventually(t, 2*time.Minute, "the kernel to remove "+head, func() bool { _, _, ok := headOf(t, nqn, 1); return !ok })
	took3, err := timedRPC(calls[0].call)
	t.Logf("timing: NodeUnstageVolume after the controllers were deleted (device removed): %s, %v", took3.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("NodeUnstageVolume after the runbook's give-up: %v", err)
	}
	if _, _, err := mountEntry(vol.staging); err == nil {
		t.Errorf("the staging mount is still there after the unstage")
	}
}

// TestFilesystem_TheUnstageStartsOnceTheKernelStopsQueueing (issue 28,
// 5): an ext4 NVMe volume with fastIOFailTmo 20 s, data synced and 8 MiB
// not, both target ports gone. NodeUnstage answers Unavailable within
// seconds naming when the kernel stops queueing (fast_io_fail_tmo's
// expiry, from when pathmend saw the paths down); once the kernel says
// "failfast expired" on both controllers, it fails the volume's I/O at
// once, so an unmount cannot wait any more: the next NodeUnstage starts
// it and completes within seconds, the paths still gone (the unsynced
// data is lost, as the message said it would be). With the ports back
// the next NodeStage checks the filesystem (fsck -p) and mounts it, and
// the synced data reads back.
func TestFilesystem_TheUnstageStartsOnceTheKernelStopsQueueing(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-fs-failfast"
	fsTarget(t, l, nqn, 256, "ext4")
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(conn)
	vol := stageFS(t, node, "vol-failfast", "ext4", twoPathContext(nqn, 1, "fastIOFailTmo", "20", "reconnectDelay", "2"))
	vol.publish(t)
	synced := bytes.Repeat([]byte("synced before the outage\n"), 1<<15)
	if err := writeSync(filepath.Join(vol.target, "synced"), synced); err != nil {
		t.Fatal(err)
	}
	unsynced := bytes.Repeat([]byte("8 MiB not yet synced\n"), (8<<20)/21)
	if err := os.WriteFile(filepath.Join(vol.target, "unsynced"), unsynced, 0o600); err != nil {
		t.Fatal(err)
	}
	vol.unpublish(t)

	cursor := kernelCursor(t)
	down := portsDown(t, l, nqn)
	waitTicks(t, logPath, time.Now(), 2)
	unstage := func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.id, StagingTargetPath: vol.staging})
		return err
	}
	took, err := timedRPC(unstage)
	st := status.Convert(err)
	t.Logf("timing: NodeUnstageVolume with every path down, the kernel queueing: %s, %s: %s", took.Round(time.Millisecond), st.Code(), st.Message())
	if st.Code() != codes.Unavailable {
		t.Fatalf("NodeUnstageVolume with every path down: %v, want Unavailable", err)
	}
	m := regexp.MustCompile(`NVMe fast_io_fail_tmo \(20 s\) expires at (\S+)\. `).FindStringSubmatch(st.Message())
	if m == nil {
		t.Fatalf("the answer names no expiry of fast_io_fail_tmo: %s", st.Message())
	}
	expires, err := time.Parse(time.RFC3339, m[1])
	if err != nil {
		t.Fatal(err)
	}
	// The kernel's own word for the end of the queueing, on each
	// controller.
	for _, c := range controllersOf(t, nqn) {
		at := kernelEvent(t, cursor, c+" failfast expired", c, "failfast expired")
		t.Logf("%s: failfast expired %s after the ports went away (pathmend said %s)", c, at.Sub(down).Round(100*time.Millisecond), expires.Sub(down).Round(time.Second))
		// pathmend counts from the first read that saw the controller
		// reconnecting, never earlier than the kernel's own start; the
		// kernel's timer work may run late on a loaded guest (1-2 s
		// seen under TCG). Either way the unmount is started a health
		// bound after pathmend's figure, and a call that still meets a
		// queue is bounded by --kernel-call-timeout: what is asserted
		// below is that the unstage completes and no call hangs.
		if at.After(expires.Add(time.Second)) {
			t.Logf("the kernel stopped queueing on %s at %s, %s after the %s pathmend named (its timer work ran late)", c, at.Format(time.RFC3339Nano), at.Sub(expires).Round(100*time.Millisecond), m[1])
		}
	}
	// pathmend starts the unmount one health bound after the expiry it
	// computed: until then it answers as before; then it completes. The
	// expiry has passed (the kernel said so above): what is left is the
	// health bound, a few ticks; tickLimit(5) is the safety net.
	var calls, slowest time.Duration
	n := 0
	eventually(t, tickLimit(5), "NodeUnstageVolume to complete once the kernel fails the I/O", func() bool {
		took, err := timedRPC(unstage)
		n++
		calls += took
		slowest = max(slowest, took)
		if err != nil && status.Code(err) != codes.Unavailable {
			t.Fatalf("NodeUnstageVolume after failfast: %v", err)
		}
		return err == nil
	})
	t.Logf("timing: NodeUnstageVolume past the expiry: completed on try %d, %s after the ports went away; slowest answer %s, mean %s",
		n, time.Since(down).Round(100*time.Millisecond), slowest.Round(time.Millisecond), (calls / time.Duration(n)).Round(time.Millisecond))
	// No call hung: each answered before its 210 s context, and none
	// answered anything but Unavailable or OK (a call meeting a queue
	// answers Aborted after --kernel-call-timeout, 10 s): both fail the
	// test above. The answer times are logged, not asserted in seconds.
	for _, ln := range readLog(t, logPath) {
		if strings.HasPrefix(ln.Msg, "A kernel call is still waiting") {
			t.Logf("pathmend: %s", ln.Raw)
		}
	}
	if _, _, err := mountEntry(vol.staging); err == nil {
		t.Errorf("the staging mount is still there after the unstage")
	}

	// The unstage disconnected every controller: the ports come back
	// to no one, and the stage connects anew.
	linkPorts(t, l, nqn)
	vol.stage(t)
	vol.publish(t)
	if b, err := os.ReadFile(filepath.Join(vol.target, "synced")); err != nil || !bytes.Equal(b, synced) {
		t.Errorf("the data synced before the outage: %d bytes read back, %v", len(b), err)
	}
	if b, err := os.ReadFile(filepath.Join(vol.target, "unsynced")); err == nil {
		t.Logf("the 8 MiB not synced: %d of %d bytes read back (given up when the kernel failed the queued I/O)", len(b), len(unsynced))
	}
	if err := writeSync(filepath.Join(vol.target, "after"), []byte("writable")); err != nil {
		t.Errorf("a write after the restage: %v", err)
	}
	for _, ln := range readLog(t, logPath) {
		if strings.HasPrefix(ln.Msg, "Filesystem check") || strings.HasPrefix(ln.Msg, "Filesystem records errors") || strings.HasPrefix(ln.Msg, "No path is live, but the kernel") {
			t.Logf("pathmend: %s", ln.Raw)
		}
	}
	vol.unpublish(t)
	vol.unstage(t)
}
