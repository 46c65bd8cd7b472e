//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// devOf reads the device number of block device name ("259:3").
func devOf(t *testing.T, name string) string {
	t.Helper()
	v, err := sysfs.New("/sys").ReadAttr("block/" + name + "/dev")
	if err != nil {
		t.Fatalf("device number of %s: %v", name, err)
	}
	return v
}

// writeSync writes data to path and fsyncs it: the error a pod's writer
// would see.
func writeSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	for _, e := range []error{werr, serr, cerr} {
		if e != nil {
			return e
		}
	}
	return nil
}

// scrape returns pathmend's /metrics at addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// storageHealth returns NodeGetStorageHealth's entries as
// "STATUS Reason" → message.
func storageHealth(t *testing.T, node csi.NodeClient) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := node.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil {
		t.Fatalf("NodeGetStorageHealth: %v", err)
	}
	out := map[string]string{}
	for _, b := range resp.GetBackendHealth() {
		out[b.GetStatus().String()+" "+b.GetReason()] = b.GetMessage()
	}
	return out
}

// replacedHealth waits for volume id to be INACCESSIBLE because its staged
// device was replaced, and returns the message.
func replacedHealth(t *testing.T, node csi.NodeClient, id string) string {
	t.Helper()
	var msg, last string
	defer func() {
		if msg == "" {
			t.Logf("the last health of %s: %s", id, last)
		}
	}()
	eventually(t, time.Minute, id+" INACCESSIBLE StagedDeviceReplaced", func() bool {
		hs := volumeHealth(t, node, id)
		last = fmt.Sprint(hs)
		if len(hs) == 1 && hs[0].GetStatus() == csi.VolumeHealthErrorType_INACCESSIBLE && hs[0].GetReason() == "StagedDeviceReplaced" {
			msg = hs[0].GetMessage()
			return true
		}
		return false
	})
	return msg
}

// TestNVMe_ANamespaceDisabledAndEnabledComesBackAsANewHead (issue 14,
// 1(a)): two volumes are namespaces 1 and 2 of one two-port subsystem,
// staged with ext4, volume 2 published. Namespace 2 is disabled on the
// target: Linux 6.1 removes its head at once; tearing the subsystem down
// would strand namespace 1, so pathmend refuses it — and rescans anyway
// (issue 14, 2). Namespace 2 is enabled again: it comes back as a new
// head. Asserted: volume 2 is INACCESSIBLE StagedDeviceReplaced (health,
// storage health, stats, the metric, diagnose) while its paths are fine;
// writes through its publication fail, as the kernel makes them; a
// NodeStage retried while it is published answers FailedPrecondition
// saying the pods must be restarted; once unpublished, NodeStage restages
// it on the new head, and the data written before reads back. Volume 1
// keeps both paths and works throughout; nothing is torn down.
func TestNVMe_ANamespaceDisabledAndEnabledComesBackAsANewHead(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-new-head"
	const metrics = "127.0.0.1:19814"
	nvmeTwoPortTarget(t, l, nqn)
	l.sh(t, fmt.Sprintf(`dev=$(lab_loop_create e2e-nvme-2 64); nvmet_ns_add %q 2 "$dev" 1 "$(lab_uuid_of %q/2)"`, nqn, nqn))
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s", "--heal-cooldown=10s", "--metrics-address="+metrics)
	node := csi.NewNodeClient(conn)
	dir := t.TempDir()
	s1, s2, target := filepath.Join(dir, "s1"), filepath.Join(dir, "s2"), filepath.Join(dir, "pod", "vol2")
	for _, d := range []string{s1, s2} {
		os.MkdirAll(d, 0o750)
		unmountOnCleanup(t, d)
	}
	unmountOnCleanup(t, target)
	stage := func(id, staging string, nsid int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := node.NodeStageVolume(ctx, stageReq(id, staging, twoPathContext(nqn, nsid)))
		return err
	}
	rpc(t, "NodeStageVolume vol-ns1", func(context.Context) error { return stage("vol-ns1", s1, 1) })
	rpc(t, "NodeStageVolume vol-ns2", func(context.Context) error { return stage("vol-ns2", s2, 2) })
	publish(t, node, "vol-ns2", s2, target)
	pattern := bytes.Repeat([]byte("before-the-namespace-went-away-"), 4096)
	for _, p := range []string{filepath.Join(s1, "pattern"), filepath.Join(target, "pattern")} {
		if err := writeSync(p, pattern); err != nil {
			t.Fatal(err)
		}
	}
	oldHead, _, _ := headOf(t, nqn, 2)
	oldDev := devOf(t, oldHead)
	ctrls := controllersOf(t, nqn)
	t.Logf("staged: namespace 2 is %s (%s), controllers %v", oldHead, oldDev, ctrls)

	disabled := time.Now()
	l.sh(t, fmt.Sprintf("nvmet_ns_disable %q 2", nqn))
	eventually(t, time.Minute, "the kernel to remove "+oldHead, func() bool { _, _, ok := headOf(t, nqn, 2); return !ok })
	t.Logf("kernel: %s removed %s after the namespace was disabled", oldHead, time.Since(disabled).Round(100*time.Millisecond))
	var refused logLine
	eventually(t, time.Minute, "a refused NamespaceMissing verdict with its rescan", func() bool {
		for _, v := range verdicts(readLog(t, logPath), nqn) {
			if v.KV["verdict"] == "refused" && v.KV["defect"] == "NamespaceMissing" && strings.HasPrefix(v.KV["firstStep"], "rescan ") {
				refused = v
				return true
			}
		}
		return false
	})
	t.Logf("verdict: %s", refused.Raw)
	if !strings.Contains(refused.KV["reason"], "would leave co-tenants") || !strings.HasSuffix(refused.KV["firstStep"], "the defect remains") {
		t.Errorf("verdict line does not say it rescanned and what it refused: %s", refused.Raw)
	}
	if hs := volumeHealth(t, node, "vol-ns1"); len(hs) != 0 {
		t.Errorf("vol-ns1 with namespace 2 gone: %v, want healthy", hs)
	}

	enabled := time.Now()
	l.sh(t, fmt.Sprintf("nvmet_ns_enable %q 2", nqn))
	var newHead string
	eventually(t, time.Minute, "namespace 2 back", func() bool {
		var ok bool
		newHead, _, ok = headOf(t, nqn, 2)
		return ok
	})
	newDev := devOf(t, newHead)
	t.Logf("kernel: namespace 2 back %s after the enable as %s (%s), was %s (%s)", time.Since(enabled).Round(100*time.Millisecond), newHead, newDev, oldHead, oldDev)
	if newHead == oldHead || newDev == oldDev {
		t.Fatalf("namespace 2 came back as the same device %s (%s): nothing to detect on this kernel", newHead, newDev)
	}
	msg := replacedHealth(t, node, "vol-ns2")
	t.Logf("vol-ns2: INACCESSIBLE StagedDeviceReplaced: %s", msg)
	for _, s := range []string{oldHead + " (" + oldDev + ")", newHead + " (" + newDev + ")", "restart the pods"} {
		if !strings.Contains(msg, s) {
			t.Errorf("health message lacks %q", s)
		}
	}
	err := writeSync(filepath.Join(target, "after"), []byte("x"))
	t.Logf("kernel: a write and fsync through the publication on the removed device: %v", err)
	if err == nil {
		t.Errorf("a write through the publication on the removed device succeeded")
	}
	if out, err := exec.Command("sh", "-c", "dmesg | grep -E 'Buffer I/O error|EXT4-fs error|Aborting journal' | grep "+oldHead+" | tail -3").CombinedOutput(); err == nil {
		t.Logf("dmesg:\n%s", bytes.TrimSpace(out))
	}
	if sh := storageHealth(t, node); !strings.Contains(sh["STORAGE_UNREACHABLE StagedDeviceReplaced"], "vol-ns2") {
		t.Errorf("storage health = %v", sh)
	}
	_, err = node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-ns2", VolumePath: target})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodeGetVolumeStats of the replaced volume: %v, want FailedPrecondition", err)
	}
	eventually(t, time.Minute, "the metric", func() bool {
		return strings.Contains(scrape(t, metrics), `pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-ns2"} 1`)
	})
	if !strings.Contains(scrape(t, metrics), `pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-ns1"} 0`) {
		t.Errorf("vol-ns1's staged device series is not 0")
	}
	diag := exec.Command(l.bin("pathmend"), "diagnose", "--state-dir", filepath.Join(filepath.Dir(logPath), "state"))
	out, err := diag.CombinedOutput()
	if code := diag.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "StagedDeviceReplaced") || !strings.Contains(string(out), "volume vol-ns2 on "+oldHead) {
		t.Errorf("diagnose: exit %d, %v\n%s", code, err, out)
	}

	// Retried while published: the pods must be restarted.
	err = stage("vol-ns2", s2, 2)
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "restart the pods") {
		t.Fatalf("NodeStage retried while published: %v, want FailedPrecondition saying the pods must be restarted", err)
	} else {
		t.Logf("NodeStage retried while published: %s", st.Code())
	}
	// The pod is restarted: unpublished, then staged again.
	unpublish(t, node, "vol-ns2", target)
	restaged := time.Now()
	rpc(t, "NodeStageVolume vol-ns2 (restage)", func(context.Context) error { return stage("vol-ns2", s2, 2) })
	t.Logf("restaged on %s in %s", newHead, time.Since(restaged).Round(100*time.Millisecond))
	got, err := os.ReadFile(filepath.Join(s2, "pattern"))
	if err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("vol-ns2's pattern after the restage: %d bytes, %v", len(got), err)
	}
	if err := writeSync(filepath.Join(s2, "after"), []byte("x")); err != nil {
		t.Errorf("write after the restage: %v", err)
	}
	if hs := volumeHealth(t, node, "vol-ns2"); len(hs) != 0 {
		t.Errorf("vol-ns2 after the restage: %v, want healthy", hs)
	}
	got, err = os.ReadFile(filepath.Join(s1, "pattern"))
	if err != nil || !bytes.Equal(got, pattern) {
		t.Errorf("vol-ns1's pattern: %d bytes, %v", len(got), err)
	}
	if now := controllersOf(t, nqn); strings.Join(now, ",") != strings.Join(ctrls, ",") {
		t.Errorf("controllers changed: %v → %v", ctrls, now)
	}
	eventually(t, time.Minute, "the metric back at 0", func() bool {
		return strings.Contains(scrape(t, metrics), `pathmend_volume_staged_device_replaced{transport="nvme-tcp",volume_id="vol-ns2"} 0`)
	})
	for _, v := range []struct{ id, staging string }{{"vol-ns1", s1}, {"vol-ns2", s2}} {
		rpc(t, "NodeUnstageVolume "+v.id, func(ctx context.Context) error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			return err
		})
	}
}

// TestNVMe_AllPathsGivenUpComesBackAsANewHead (issue 14, 1(b)): a volume
// staged with a short ctrlLossTmo (warned about at stage) loses both
// ports long enough for the kernel to give up on both controllers: the
// head is removed. When the ports return, pathmend reconnects both paths
// and the namespace is a new head; the volume is StagedDeviceReplaced,
// and a NodeStage with nothing published restages it, the data intact.
func TestNVMe_AllPathsGivenUpComesBackAsANewHead(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-given-up"
	nvmeTwoPortTarget(t, l, nqn)
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(conn)
	staging := filepath.Join(t.TempDir(), "staging")
	os.MkdirAll(staging, 0o750)
	unmountOnCleanup(t, staging)
	vctx := twoPathContext(nqn, 1, "ctrlLossTmo", "4", "reconnectDelay", "1")
	stage := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := node.NodeStageVolume(ctx, stageReq("vol-gu", staging, vctx))
		return err
	}
	rpc(t, "NodeStageVolume", func(context.Context) error { return stage() })
	var w []logLine
	eventually(t, time.Minute, "the warning about the short ctrlLossTmo", func() bool {
		w = withMsg(readLog(t, logPath), "Volume context sets a short ctrlLossTmo")
		return len(w) > 0
	})
	if len(w) != 1 {
		t.Errorf("want one warning about the short ctrlLossTmo, got %d", len(w))
	}
	t.Logf("warning: %s", w[0].Raw)
	pattern := bytes.Repeat([]byte("before-every-path-was-lost-"), 4096)
	if err := writeSync(filepath.Join(staging, "pattern"), pattern); err != nil {
		t.Fatal(err)
	}
	oldHead, _, _ := headOf(t, nqn, 1)
	oldDev := devOf(t, oldHead)

	l.sh(t, fmt.Sprintf("nvmet_port_unlink 1 %q; nvmet_port_unlink 2 %q", nqn, nqn))
	lost := time.Now()
	eventually(t, 3*time.Minute, "the kernel to give up on both controllers", func() bool { return len(controllersOf(t, nqn)) == 0 })
	gone := time.Since(lost)
	_, _, headLeft := headOf(t, nqn, 1)
	t.Logf("kernel: both controllers deleted %s after the ports went away (ctrl_loss_tmo 4); head %s left: %t", gone.Round(100*time.Millisecond), oldHead, headLeft)
	if headLeft {
		t.Fatalf("head %s survived the loss of every controller", oldHead)
	}
	waitTicks(t, logPath, time.Now(), 5) // away a while longer: pathmend probes refusals each tick

	l.sh(t, fmt.Sprintf("nvmet_port_link 1 %q; nvmet_port_link 2 %q", nqn, nqn))
	back := time.Now()
	var newHead string
	eventually(t, 2*time.Minute, "pathmend to reconnect both paths", func() bool {
		var legs []string
		var ok bool
		newHead, legs, ok = headOf(t, nqn, 1)
		return ok && len(legs) == 2
	})
	newDev := devOf(t, newHead)
	t.Logf("both paths back %s after the ports returned; namespace 1 is %s (%s), was %s (%s)", time.Since(back).Round(100*time.Millisecond), newHead, newDev, oldHead, oldDev)
	msg := replacedHealth(t, node, "vol-gu")
	t.Logf("INACCESSIBLE StagedDeviceReplaced: %s", msg)
	if !strings.Contains(msg, "which the kernel removed") {
		t.Errorf("message does not say the kernel removed the device: %s", msg)
	}
	rpc(t, "NodeStageVolume (restage)", func(context.Context) error { return stage() })
	got, err := os.ReadFile(filepath.Join(staging, "pattern"))
	if err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("pattern after the restage: %d bytes, %v", len(got), err)
	}
	if hs := volumeHealth(t, node, "vol-gu"); len(hs) != 0 {
		t.Errorf("health after the restage: %v", hs)
	}
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-gu", StagingTargetPath: staging})
		return err
	})
}

// TestNVMe_DefaultTimeoutsKeepTheHeadThroughAnOutage (issue 14, 1,
// prevention): controllers connected by hand with the kernel's defaults
// (ctrl_loss_tmo 600, reconnect_delay 10, fast_io_fail_tmo off) are used
// by a volume staged without timeouts; pathmend aligns them on the live
// controllers with its defaults (-1, 5, 600) — Linux 6.1 accepts the
// writes — and the head has no delayed_removal_secs on 6.1. Then both
// ports are away for 20 s, five times the ctrlLossTmo that cost the
// volume of the test above its device: the head stays, a write issued
// during the outage completes when the ports return, and the volume is
// healthy on the same device.
func TestNVMe_DefaultTimeoutsKeepTheHeadThroughAnOutage(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-keep-head"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	l.sh(t, fmt.Sprintf("nvme_host_connect %q 127.0.0.1 4420 >/dev/null; nvme_host_connect %q 127.0.0.1 4421 >/dev/null", nqn, nqn))
	ctrls := controllersOf(t, nqn)
	if len(ctrls) != 2 {
		t.Fatalf("controllers connected by hand: %v", ctrls)
	}
	attrs := func(c string) string {
		var s []string
		for _, a := range []string{"ctrl_loss_tmo", "reconnect_delay", "fast_io_fail_tmo"} {
			v, _ := fsys.ReadAttr("class/nvme/" + c + "/" + a)
			s = append(s, a+"="+v)
		}
		return strings.Join(s, " ")
	}
	for _, c := range ctrls {
		t.Logf("kernel defaults: %s %s", c, attrs(c))
	}
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(conn)
	staging := filepath.Join(t.TempDir(), "staging")
	os.MkdirAll(staging, 0o750)
	unmountOnCleanup(t, staging)
	rpc(t, "NodeStageVolume", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-keep", staging, twoPathContext(nqn, 1)))
		return err
	})
	const want = "ctrl_loss_tmo=off reconnect_delay=5 fast_io_fail_tmo=600"
	eventually(t, time.Minute, "pathmend to align the live controllers", func() bool {
		for _, c := range ctrls {
			if attrs(c) != want {
				return false
			}
		}
		return true
	})
	for _, c := range ctrls {
		t.Logf("aligned on the live controller: %s %s", c, attrs(c))
	}
	eventually(t, time.Minute, "6 alignment lines, 3 attributes × 2 controllers", func() bool {
		return len(withMsg(readLog(t, logPath), "Aligned a timeout with the staged volumes")) == 6
	})
	head, _, _ := headOf(t, nqn, 1)
	dev := devOf(t, head)
	if _, ok, _ := fsys.ReadOptionalAttr("block/" + head + "/delayed_removal_secs"); ok {
		t.Logf("this kernel has delayed_removal_secs on %s", head)
	} else {
		t.Logf("kernel: %s has no delayed_removal_secs (Linux 6.1)", head)
	}
	if err := writeSync(filepath.Join(staging, "before"), []byte("before")); err != nil {
		t.Fatal(err)
	}

	l.sh(t, fmt.Sprintf("nvmet_port_unlink 1 %q; nvmet_port_unlink 2 %q", nqn, nqn))
	away := time.Now()
	eventually(t, time.Minute, "both controllers connecting", func() bool {
		for _, c := range ctrls {
			if v, _ := fsys.ReadAttr("class/nvme/" + c + "/state"); v != "connecting" {
				return false
			}
		}
		return true
	})
	wrote := make(chan error, 1)
	go func() { wrote <- writeSync(filepath.Join(staging, "during"), bytes.Repeat([]byte("d"), 1<<20)) }()
	time.Sleep(time.Until(away.Add(20 * time.Second)))
	h, _, ok := headOf(t, nqn, 1)
	if !ok || h != head {
		t.Fatalf("after 20 s without a port: head %q (ok %t), want %s kept", h, ok, head)
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write during the outage returned before the ports came back: %v", err)
	default:
	}
	l.sh(t, fmt.Sprintf("nvmet_port_link 1 %q; nvmet_port_link 2 %q", nqn, nqn))
	back := time.Now()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the write queued during the outage failed: %v", err)
		}
		t.Logf("the write queued during the 20 s outage completed %s after the ports returned", time.Since(back).Round(100*time.Millisecond))
	case <-time.After(60 * time.Second):
		t.Fatal("the write queued during the outage did not complete within 60 s of the ports returning")
	}
	eventually(t, 2*time.Minute, "the volume healthy again", func() bool { return len(volumeHealth(t, node, "vol-keep")) == 0 })
	if d := devOf(t, head); d != dev {
		t.Errorf("%s is now %s, was %s", head, d, dev)
	}
	if now := controllersOf(t, nqn); strings.Join(now, ",") != strings.Join(ctrls, ",") {
		t.Errorf("controllers changed: %v → %v", ctrls, now)
	}
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-keep", StagingTargetPath: staging})
		return err
	})
}

// TestNVMe_RescanBringsBackANamespaceWhoseEventWasHeldBack (issue 14, 2):
// two volumes are namespaces 1 and 2 of one subsystem reached through
// nqnproxy, which can hold back the target's asynchronous events.
// Namespace 2 is disabled (the event passes: the host removes its head);
// pathmend refuses the teardown (namespace 1 would be stranded) and
// rescans. Then, with events held back, namespace 2 is enabled: the host
// is not told, and the namespace stays missing — until pathmend's next
// rescan, one cooldown after the first, brings it back, with nothing torn
// down.
func TestNVMe_RescanBringsBackANamespaceWhoseEventWasHeldBack(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-held-event"
	const cooldown = 20 * time.Second
	hold := filepath.Join(t.TempDir(), "hold-aen")
	nvmeTwoPortTarget(t, l, nqn)
	l.sh(t, fmt.Sprintf(`dev=$(lab_loop_create e2e-nvme-2 64); nvmet_ns_add %[1]q 2 "$dev" 1 "$(lab_uuid_of %[1]q/2)"
nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 %[1]q %[1]q %[2]q
nqnproxy_start 127.0.0.3:4421 127.0.0.1:4421 %[1]q %[1]q %[2]q`, nqn, hold))
	conn, logPath := startPathmendLog(t, l, "lab-node", "--heal=repair", "--monitor-interval=1s", "--heal-cooldown="+cooldown.String())
	node := csi.NewNodeClient(conn)
	dir := t.TempDir()
	vctx := func(nsid int) map[string]string {
		return map[string]string{"transport": "nvme-tcp", "nqn": nqn, "nsid": fmt.Sprint(nsid),
			"endpoints": "127.0.0.3:4420,127.0.0.3:4421", "optimizedEndpoints": "127.0.0.3:4420"}
	}
	var stagings []string
	for nsid := 1; nsid <= 2; nsid++ {
		s := filepath.Join(dir, fmt.Sprint("s", nsid))
		os.MkdirAll(s, 0o750)
		unmountOnCleanup(t, s)
		stagings = append(stagings, s)
		id := fmt.Sprint("vol-held-", nsid)
		rpc(t, "NodeStageVolume "+id, func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, stageReq(id, s, vctx(nsid)))
			return err
		})
	}
	ctrls := append(controllersTo(t, nqn, "127.0.0.3", "4420"), controllersTo(t, nqn, "127.0.0.3", "4421")...)
	oldHead, _, _ := headOf(t, nqn, 2)

	l.sh(t, fmt.Sprintf("nvmet_ns_disable %q 2", nqn))
	eventually(t, time.Minute, "the host to drop namespace 2", func() bool { _, _, ok := headOf(t, nqn, 2); return !ok })
	var first logLine
	eventually(t, time.Minute, "the refusal with its rescan", func() bool {
		for _, v := range verdicts(readLog(t, logPath), nqn) {
			if v.KV["verdict"] == "refused" && strings.HasPrefix(v.KV["firstStep"], "rescan ") {
				first = v
				return true
			}
		}
		return false
	})
	t.Logf("verdict: %s", first.Raw)

	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	enabled := time.Now()
	l.sh(t, fmt.Sprintf("nvmet_ns_enable %q 2", nqn))
	// The event is the proxy holding the target's announcement back.
	var held string
	eventually(t, 2*time.Minute, "a proxy to hold back the namespace's change event", func() bool {
		held, _ = l.trySh(t, time.Minute, "grep -h 'held back asynchronous event' /run/lab/nqnproxy-*.log || true")
		return strings.Contains(held, "held back")
	})
	if _, _, ok := headOf(t, nqn, 2); ok {
		t.Fatal("the host found namespace 2 with its change event held back: the hold does not work")
	}
	t.Logf("namespace 2 enabled with the event held back; %s later the host still lacks it; proxies: %s", time.Since(enabled).Round(100*time.Millisecond), held)
	var head string
	eventually(t, cooldown+2*time.Minute, "pathmend's next rescan to bring namespace 2 back", func() bool {
		var ok bool
		head, _, ok = headOf(t, nqn, 2)
		return ok
	})
	var cured logLine
	eventually(t, time.Minute, "the repaired verdict line", func() bool {
		for _, v := range verdicts(readLog(t, logPath), nqn) {
			if v.KV["verdict"] == "repaired" {
				cured = v
			}
		}
		return cured.Raw != ""
	})
	t.Logf("namespace 2 back as %s (was %s) %s after the enable; verdict: %s", head, oldHead, time.Since(enabled).Round(100*time.Millisecond), cured.Raw)
	if !strings.HasPrefix(cured.KV["reason"], "rescan ") || !strings.Contains(cured.KV["reason"], "nothing torn down") {
		t.Errorf("no repaired verdict by the rescan: %s", cured.Raw)
	}
	// The first rescan's line is logged after it waited 2 s for the
	// namespace; the cooldown runs from its start.
	if d := cured.At.Sub(first.At); d < cooldown-3*time.Second {
		t.Errorf("rescanned again %s after the first rescan's verdict, inside the cooldown %s", d, cooldown)
	} else {
		t.Logf("second rescan %s after the first one's verdict (cooldown %s, the first waited 2 s for the namespace)", d.Round(10*time.Millisecond), cooldown)
	}
	now := append(controllersTo(t, nqn, "127.0.0.3", "4420"), controllersTo(t, nqn, "127.0.0.3", "4421")...)
	if fmt.Sprint(now) != fmt.Sprint(ctrls) {
		t.Errorf("controllers changed: %v → %v", ctrls, now)
	}
	os.Remove(hold)
	for i, s := range stagings {
		id := fmt.Sprint("vol-held-", i+1)
		rpc(t, "NodeUnstageVolume "+id, func(ctx context.Context) error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: s})
			return err
		})
	}
}

// TestISCSI_ALUNWhoseDiskWasRecreatedIsReportedAndRestaged (issue 14, 1,
// iSCSI): a one-portal volume on a node without multipathd is staged on the
// LUN's disk and published. Its session is logged out and in by hand:
// Linux deletes the disk and the new session makes a new one, while the
// staging mount stays on the deleted disk. pathmend (observe mode: it
// kicks nothing) reports the volume INACCESSIBLE StagedDeviceReplaced; a
// NodeStage retried while published says the pods must be restarted;
// unpublished, NodeStage restages it on the new disk and the pattern reads
// back. (With multipathd the map usually survives a path re-created under
// it: the staged device is then the same.)
func TestISCSI_ALUNWhoseDiskWasRecreatedIsReportedAndRestaged(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-recreated"
	const id = "vol-e2e-recreated"
	lioTarget(t, l, iqn, "e2e-recreated", "", "", "127.0.0.1")
	l.sh(t, "multipathd_stop")
	conn := startPathmend(t, l, "lab-node", "--heal=observe", "--monitor-interval=1s", "--no-multipathd")
	node := csi.NewNodeClient(conn)
	sys := sysfs.New("/sys")
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod", "vol")
	os.MkdirAll(staging, 0o750)
	unmountOnCleanup(t, staging)
	unmountOnCleanup(t, target)
	vctx := map[string]string{"transport": "iscsi", "iqn": iqn, "portals": noActionPortalA, "lun": "0"}
	stage := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := node.NodeStageVolume(ctx, stageReq(id, staging, vctx))
		return err
	}
	rpc(t, "NodeStageVolume", func(context.Context) error { return stage() })
	publish(t, node, id, staging, target)
	pattern := bytes.Repeat([]byte("before-the-disk-was-recreated-"), 4096)
	if err := writeSync(filepath.Join(target, "pattern"), pattern); err != nil {
		t.Fatal(err)
	}
	s, ok := sessionTo(t, sys, iqn, noActionPortalA)
	lun, _ := s.LUN(0)
	if !ok || lun.Disk == "" {
		t.Fatalf("no disk of LUN 0 on %+v", s)
	}
	oldDisk, oldDev := lun.Disk, devOf(t, lun.Disk)
	l.sh(t, fmt.Sprintf("iscsiadm -m node -T %[1]s -p %[2]s -u && iscsiadm -m node -T %[1]s -p %[2]s --login", iqn, noActionPortalA))
	var newDisk string
	eventually(t, 2*time.Minute, "the LUN's new disk", func() bool {
		s, ok := sessionTo(t, sys, iqn, noActionPortalA)
		if !ok || !s.State.LoggedIn() {
			return false
		}
		l, ok := s.LUN(0)
		newDisk = l.Disk
		return ok && l.Disk != "" && l.Running()
	})
	newDev := devOf(t, newDisk)
	t.Logf("kernel: logout + login deleted %s (%s); the LUN is now %s (%s)", oldDisk, oldDev, newDisk, newDev)
	if newDev == oldDev {
		t.Fatalf("the LUN came back as the same device %s", newDev)
	}
	t.Logf("INACCESSIBLE StagedDeviceReplaced: %s", replacedHealth(t, node, id))
	if st, _ := status.FromError(stage()); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "restart the pods") {
		t.Fatalf("NodeStage retried while published: %v", st)
	}
	unpublish(t, node, id, target)
	rpc(t, "NodeStageVolume (restage)", func(context.Context) error { return stage() })
	got, err := os.ReadFile(filepath.Join(staging, "pattern"))
	if err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("pattern after the restage: %d bytes, %v", len(got), err)
	}
	if hs := volumeHealth(t, node, id); len(hs) != 0 {
		t.Errorf("health after the restage: %v", hs)
	}
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
}
