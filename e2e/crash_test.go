//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// pathmend SIGKILLed in the middle of its work, on the real kernel. A
// restarted pathmend, with the retries or the unstage kubelet sends,
// must leave the volume staged with all its paths or cleanly unstaged:
// never a controller nobody owns, never a path short.
//
// The middle is made wide and certain from outside, without a hook in
// pathmend: an iptables rule drops new TCP connections (SYN) to one
// endpoint, so a connect to it hangs while established connections go
// on. pathmend is killed while it waits there.

// synDrop is an iptables rule that drops new TCP connections (SYNs) to
// one endpoint.
type synDrop struct {
	l          lab
	addr, port string
	lifted     bool
}

// dropNewConnections drops SYNs to addr:port until the rule is lifted
// (at the test's end at the latest).
func dropNewConnections(t *testing.T, l lab, addr string, port int) *synDrop {
	t.Helper()
	d := &synDrop{l: l, addr: addr, port: fmt.Sprint(port)}
	l.sh(t, "iptables -I "+d.rule())
	t.Cleanup(func() { d.lift(t) })
	return d
}

func (d *synDrop) rule() string {
	return fmt.Sprintf("INPUT -p tcp -d %s --dport %s --syn -j DROP", d.addr, d.port)
}

// lift removes the rule; once.
func (d *synDrop) lift(t *testing.T) {
	t.Helper()
	if !d.lifted {
		d.lifted = true
		d.l.sh(t, "iptables -D "+d.rule())
	}
}

// packets is how many SYNs the rule dropped so far: the kernel counts
// them, so a connect that hangs in the drop is an event a test can wait
// for, not a guess of how long a connect takes to start.
func (d *synDrop) packets(t *testing.T) int {
	t.Helper()
	out := d.l.sh(t, fmt.Sprintf(`iptables -L INPUT -v -x -n | awk '$3 == "DROP" && index($0, " %s ") && index($0, "dpt:%s flags:") { n += $1 } END { print n + 0 }'`, d.addr, d.port))
	var n int
	if _, err := fmt.Sscan(out, &n); err != nil {
		t.Fatalf("dropped SYNs to %s:%s: %q", d.addr, d.port, out)
	}
	return n
}

// waitConnecting waits until a SYN to the endpoint was dropped after
// before packets: someone is in a connect that hangs there.
func (d *synDrop) waitConnecting(t *testing.T, before int, who string) {
	t.Helper()
	eventually(t, 2*time.Minute, who+" to try "+d.addr+":"+d.port+" (a SYN dropped)", func() bool {
		return d.packets(t) > before
	})
}

// stageInBackground starts a NodeStage and returns its result channel.
func stageInBackground(node csi.NodeClient, req *csi.NodeStageVolumeRequest) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := node.NodeStageVolume(ctx, req)
		done <- err
	}()
	return done
}

// killedMidStage stages a two-path volume with new connections to its
// second endpoint dropped, and SIGKILLs pathmend once the first path is
// connected and the stage's connect to the second has sent its SYN (the
// drop rule counted it): after the connect, before the mount. It returns
// pathmend's directory (for a restart), the staging path and the drop.
func killedMidStage(t *testing.T, l lab, nqn, id string) (dir, staging string, p *pathmendProc, drop *synDrop) {
	t.Helper()
	l.teardownAll(t)
	nvmeTwoPortTarget(t, l, nqn)
	dir = t.TempDir()
	p = startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s", "--connect-timeout=30s")
	node := csi.NewNodeClient(p.conn)
	staging = filepath.Join(dir, "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	unmountOnCleanup(t, staging)
	drop = dropNewConnections(t, l, "127.0.0.1", 4421)
	before := drop.packets(t)
	done := stageInBackground(node, stageReq(id, staging, twoPathContext(nqn, 1)))
	eventually(t, 2*time.Minute, "the stage's first path (127.0.0.1:4420) connected", func() bool {
		return len(controllersTo(t, nqn, "127.0.0.1", "4420")) == 1
	})
	drop.waitConnecting(t, before, "the stage")
	select {
	case err := <-done:
		t.Fatalf("NodeStage returned before the kill (%v): the connect to 127.0.0.1:4421 did not hang", err)
	default:
	}
	p.kill()
	if err := <-done; err == nil {
		t.Fatal("NodeStage succeeded although pathmend was killed in it")
	}
	if opts, err := mountOptions(staging); err == nil {
		t.Fatalf("killed after the mount, not before it: %s is mounted (%s)", staging, opts)
	}
	t.Logf("killed mid-stage: controllers %v to 127.0.0.1:4420, %v to 127.0.0.1:4421, %s not mounted",
		controllersTo(t, nqn, "127.0.0.1", "4420"), controllersTo(t, nqn, "127.0.0.1", "4421"), staging)
	return dir, staging, p, drop
}

// Killed after the connect, before the mount; restarted; kubelet retries
// the NodeStage (it does until one succeeds): the volume ends staged with
// both paths and one controller per endpoint.
func TestCrash_KilledMidStageThenStageRetriedEndsStagedWithAllPaths(t *testing.T) {
	l := needLab(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-crash-stage"
	dir, staging, _, drop := killedMidStage(t, l, nqn, "vol-crash-stage")
	drop.lift(t)
	p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(p.conn)
	rpc(t, "NodeStageVolume (kubelet's retry)", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-crash-stage", staging, twoPathContext(nqn, 1)))
		return err
	})
	fs := watchFS(t, staging)
	eventually(t, 2*time.Minute, "the volume healthy (both paths)", func() bool {
		return len(volumeHealth(t, node, "vol-crash-stage")) == 0
	})
	for _, svc := range []string{"4420", "4421"} {
		if cs := controllersTo(t, nqn, "127.0.0.1", svc); len(cs) != 1 || cs[0].State != "live" {
			t.Errorf("controllers to 127.0.0.1:%s after the retry: %v, want one live", svc, cs)
		}
	}
	fs.assertIntact(t, l)
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-crash-stage", StagingTargetPath: staging})
		return err
	})
	eventually(t, time.Minute, "no controller left after the unstage", func() bool { return len(controllersOf(t, nqn)) == 0 })
}

// Killed after the connect, before the mount; restarted; the pod is gone,
// so kubelet unstages the volume it is not sure about: nothing of it may
// stay behind — the controller the killed stage connected included.
func TestCrash_KilledMidStageThenUnstagedLeavesNothing(t *testing.T) {
	l := needLab(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-crash-unstage"
	dir, staging, _, drop := killedMidStage(t, l, nqn, "vol-crash-unstage")
	drop.lift(t)
	p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s")
	node := csi.NewNodeClient(p.conn)
	rpc(t, "NodeUnstageVolume (kubelet, the pod gone)", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-crash-unstage", StagingTargetPath: staging})
		return err
	})
	eventually(t, 2*time.Minute, "no controller of the volume's subsystem left", func() bool { return len(controllersOf(t, nqn)) == 0 })
	if recs, _ := os.ReadDir(filepath.Join(dir, "state", "volumes")); len(recs) > 0 {
		var names []string
		for _, r := range recs {
			names = append(names, r.Name())
		}
		t.Errorf("staged-volume records left: %s", strings.Join(names, ", "))
	}
}

// Killed in a repair, after the teardown, before the reconnect. The
// volume has two paths, the second through a second array that shares the
// NQN (nqnproxy); that array's namespace is given another UUID
// (ControllerNotContributing) while new connections to it are dropped, so
// the repair's teardown of its controller is followed by a reconnect that
// hangs: pathmend is killed there. The array is fixed and the drop lifted;
// the restarted pathmend, from its records and sysfs alone, reconnects the
// path: the volume ends with both paths, its filesystem writable with its
// data.
func TestCrash_KilledMidRepairEndsWithAllPaths(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-crash-repair"
	const alias = "nqn.2024-01.io.pathmend.lab:e2e-crash-repair-b"
	l.sh(t, fmt.Sprintf(`
modprobe nvme_tcp
nvmet_port_create 1 127.0.0.1 4420
nvmet_port_ana 1 1 optimized
nvmet_subsys_create %[1]q 1 99
nvmet_subsys_create %[2]q 100 199
dev=$(lab_loop_create e2e-crash-array 64)
nvmet_ns_add %[1]q 1 "$dev" 1 "$(lab_uuid_of %[1]q/1)"
nvmet_ns_add %[2]q 1 "$dev" 1 "$(lab_uuid_of %[1]q/1)"
nvmet_port_link 1 %[1]q
nvmet_port_link 1 %[2]q
nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 %[1]q %[2]q
`, nqn, alias))
	dir := t.TempDir()
	flags := []string{"--heal=repair", "--monitor-interval=1s", "--heal-grace=1s", "--heal-cooldown=60s"}
	p := startPathmendIn(t, l, dir, "lab-node", flags...)
	node := csi.NewNodeClient(p.conn)
	staging := filepath.Join(dir, "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	unmountOnCleanup(t, staging)
	vctx := map[string]string{
		"transport": "nvme-tcp", "nqn": nqn, "nsid": "1",
		"endpoints": "127.0.0.1:4420,127.0.0.3:4420", "optimizedEndpoints": "127.0.0.1:4420",
	}
	rpc(t, "NodeStageVolume", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-crash-repair", staging, vctx))
		return err
	})
	eventually(t, 2*time.Minute, "the volume healthy (both paths)", func() bool {
		return len(volumeHealth(t, node, "vol-crash-repair")) == 0
	})
	fs := watchFS(t, staging)
	b := controllersTo(t, nqn, "127.0.0.3", "4420")
	if len(b) != 1 {
		t.Fatalf("controllers to the second array: %v", b)
	}
	drop := dropNewConnections(t, l, "127.0.0.3", 4420)
	before := drop.packets(t)
	l.sh(t, fmt.Sprintf(`ns=$NVMET/subsystems/%q/namespaces/1
echo 0 >"$ns/enable"; echo "$(lab_uuid_of %q/other)" >"$ns/device_uuid"; echo 1 >"$ns/enable"`, alias, alias))
	// The events, in the order pathmend makes them: the repair's verdict
	// (logged once its teardown returned), the controller gone from
	// sysfs, then the job's reconnect of the endpoint, whose SYN the rule
	// drops. Waiting for the controller alone lost a race under load: it
	// leaves sysfs inside the teardown, before the verdict is logged.
	var repaired string
	eventually(t, 2*time.Minute, "the repair's verdict for "+b[0].Name+" (ControllerNotContributing) in pathmend's log", func() bool {
		for _, v := range verdicts(readLog(t, p.logPath), nqn+" tcp 127.0.0.3:4420") {
			if v.KV["verdict"] == "repaired" {
				repaired = v.Raw
			}
		}
		return repaired != ""
	})
	eventually(t, time.Minute, b[0].Name+" gone after its teardown", func() bool {
		return len(controllersTo(t, nqn, "127.0.0.3", "4420")) == 0
	})
	drop.waitConnecting(t, before, "pathmend's reconnect")
	p.kill()
	killedAt := time.Now()
	if cs := controllersTo(t, nqn, "127.0.0.3", "4420"); len(cs) != 0 {
		t.Fatalf("killed after the reconnect, not before it: %v", cs)
	}
	t.Logf("killed after the teardown, in the reconnect: %s", repaired)

	drop.lift(t)
	l.sh(t, fmt.Sprintf(`ns=$NVMET/subsystems/%q/namespaces/1
echo 0 >"$ns/enable"; echo "$(lab_uuid_of %q/1)" >"$ns/device_uuid"; echo 1 >"$ns/enable"`, alias, nqn))
	p = startPathmendIn(t, l, dir, "lab-node", flags...)
	node = csi.NewNodeClient(p.conn)
	eventually(t, 3*time.Minute, "the restarted pathmend to give the volume both paths back", func() bool {
		return len(volumeHealth(t, node, "vol-crash-repair")) == 0
	})
	t.Logf("both paths back %s after the kill", time.Since(killedAt).Round(100*time.Millisecond))
	for _, ep := range [][2]string{{"127.0.0.1", "4420"}, {"127.0.0.3", "4420"}} {
		if cs := controllersTo(t, nqn, ep[0], ep[1]); len(cs) != 1 || cs[0].State != "live" {
			t.Errorf("controllers to %s:%s: %v, want one live", ep[0], ep[1], cs)
		}
	}
	fs.assertIntact(t, l)
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-crash-repair", StagingTargetPath: staging})
		return err
	})
	eventually(t, time.Minute, "no controller left after the unstage", func() bool { return len(controllersOf(t, nqn)) == 0 })
}
