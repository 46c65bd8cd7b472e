//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// The node plugin healing another driver's subsystem beside its own
// volumes (`serve --heal-foreign`): the same NVMe pass as companion mode,
// in the plugin's process, under the leases its RPCs take.

// ctrlKey names one controller object: its name and its directory's
// inode (kernfs never gives a re-created directory the same one), so a
// controller deleted and connected again under the same name differs.
type ctrlKey struct {
	name string
	ino  uint64
}

// ctrlKeys returns the controllers of nqn, by port.
func ctrlKeys(t *testing.T, fsys sysfs.FS, nqn string) map[string]ctrlKey {
	t.Helper()
	out := map[string]ctrlKey{}
	for _, svc := range []string{"4420", "4421"} {
		c := ctrlTo(fsys, nqn, svc)
		if c == "" {
			continue
		}
		id, err := fsys.Identity("class/nvme/" + c)
		if err != nil {
			continue
		}
		out[svc] = ctrlKey{c, id.Ino}
	}
	return out
}

// TestServeHealForeign_ReconnectsAForeignGivenUpPathAndNothingElse: the
// plugin stages a volume of its own (subsystem own, two ports); the
// "other driver" (the test, nvme-cli with its own host identity and a
// 4 s ctrl_loss_tmo) connects subsystem foreign through the same two
// target ports and mounts a file system on it. Port 2 of foreign only is
// kept away until the kernel gives its controller up; when it is back the
// plugin connects it again with the learned options. Then the refusal of
// the rule: the driver disconnects the live port-2 controller, and the
// plugin leaves it disconnected. Throughout, foreign's port-1 controller
// and both of the plugin's own controllers are the same kernel objects
// (never torn down or reconnected), the plugin's volume stays healthy,
// and the plugin learns nothing of its own subsystem. Nothing asserts how
// fast a step is: only what happened, with generous bounds for TCG.
func TestServeHealForeign_ReconnectsAForeignGivenUpPathAndNothingElse(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const (
		own     = "nqn.2024-01.io.pathmend.lab:e2e-foreign-own"
		foreign = "nqn.2024-01.io.pathmend.lab:e2e-foreign-theirs"
	)
	nvmeTwoPortTarget(t, l, own)
	l.sh(t, fmt.Sprintf(`
nqn=%q
dev=$(lab_loop_create e2e-nvme-foreign 64)
nvmet_subsys_create "$nqn"
nvmet_ns_add "$nqn" 1 "$dev" 1 "$(lab_uuid_of "$nqn/1")"
nvmet_port_link 1 "$nqn"
nvmet_port_link 2 "$nqn"
`, foreign))
	fsys := sysfs.New("/sys")

	dir := t.TempDir()
	p := startPathmendIn(t, l, dir, "lab-node", "--heal=repair", "--monitor-interval=1s",
		"--heal-foreign", "--nvme-reconnect", "--nvme-repairs")
	node := csi.NewNodeClient(p.conn)
	staging := filepath.Join(dir, "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	unmountOnCleanup(t, staging)
	rpc(t, "NodeStageVolume", func(ctx context.Context) error {
		_, err := node.NodeStageVolume(ctx, stageReq("vol-own", staging, twoPathContext(own, 1)))
		return err
	})
	ownBefore := ctrlKeys(t, fsys, own)
	if len(ownBefore) != 2 {
		t.Fatalf("the plugin's own controllers after stage: %v, want two", ownBefore)
	}

	// The other driver attaches and mounts.
	driverConnect(t, l, fsys, foreign, "4420")
	driverConnect(t, l, fsys, foreign, "4421")
	var head string
	eventually(t, 2*time.Minute, "the foreign namespace head with two legs", func() bool {
		h, legs, ok := headOf(t, foreign, 1)
		head = h
		return ok && len(legs) == 2
	})
	mnt := t.TempDir()
	unmountOnCleanup(t, mnt)
	pattern := bytes.Repeat([]byte("the-other-drivers-data-"), 4096)
	l.sh(t, fmt.Sprintf("mkfs.ext4 -q -F /dev/%s && mount /dev/%s %s", head, head, mnt))
	if err := os.WriteFile(filepath.Join(mnt, "pattern"), pattern, 0o600); err != nil {
		t.Fatal(err)
	}
	l.sh(t, "sync")
	waitLearned(t, dir, foreign)
	foreignBefore := ctrlKeys(t, fsys, foreign)

	// (1) The kernel gives foreign's port 2 up; the plugin reconnects it.
	giveUpPort2(t, l, fsys, foreign)
	l.sh(t, fmt.Sprintf("nvmet_port_link 2 %q", foreign))
	var back string
	eventually(t, 4*time.Minute, "the plugin to reconnect foreign's port 4421", func() bool {
		back = ctrlTo(fsys, foreign, "4421")
		return back != "" && attrIs(fsys, "class/nvme/"+back+"/state", "live")()
	})
	checkDriversOptions(t, fsys, back)
	eventually(t, 2*time.Minute, "both legs of the foreign head again", func() bool {
		h, legs, ok := headOf(t, foreign, 1)
		return ok && h == head && len(legs) == 2
	})
	l.sh(t, "sync; echo 3 > /proc/sys/vm/drop_caches")
	if got, err := os.ReadFile(filepath.Join(mnt, "pattern")); err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("the other driver's data after the give-up and reconnect: %d bytes, %v", len(got), err)
	}

	// (2) The rule refuses: the driver disconnects a live controller
	// (its NodeUnstage would): forgotten, never connected again.
	l.sh(t, "nvme disconnect -d "+back+" >/dev/null")
	eventually(t, 2*time.Minute, "the plugin to forget foreign's port 4421", func() bool {
		eps := learned(t, dir, foreign)
		return len(eps) == 1 && eps[0].Trsvcid == "4420"
	})
	waitTicks(t, p.logPath, time.Now(), 6)
	if c := ctrlTo(fsys, foreign, "4421"); c != "" {
		t.Errorf("%s: port 4421 of foreign connected again after the driver disconnected it", c)
	}

	// Nothing else was touched.
	if got := ctrlKeys(t, fsys, foreign)["4420"]; got != foreignBefore["4420"] {
		t.Errorf("foreign's healthy port-1 controller was %v, is %v: the plugin touched it", foreignBefore["4420"], got)
	}
	if got := ctrlKeys(t, fsys, own); fmt.Sprint(got) != fmt.Sprint(ownBefore) {
		t.Errorf("the plugin's own controllers were %v, are %v", ownBefore, got)
	}
	if eps := learned(t, dir, own); len(eps) != 0 {
		t.Errorf("the plugin learned its own staged subsystem: %+v", eps)
	}
	if hs := volumeHealth(t, node, "vol-own"); len(hs) != 0 {
		t.Errorf("the plugin's own volume is not healthy: %v", hs)
	}
	rpc(t, "NodeUnstageVolume", func(ctx context.Context) error {
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-own", StagingTargetPath: staging})
		return err
	})
	p.stop()
	log, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	var reconnects []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "Reconnected path") && strings.Contains(line, foreign) {
			reconnects = append(reconnects, line)
		}
	}
	// One reconnect of foreign, of its port 2 after the give-up; none
	// after the disconnect. (The plugin's own subsystem is checked by its
	// controllers above.)
	if len(reconnects) != 1 || !strings.Contains(reconnects[0], "127.0.0.1:4421") || !strings.Contains(reconnects[0], "learned=true") {
		t.Errorf("reconnects of foreign: want exactly the one of port 4421 with the learned options, got:\n%s", strings.Join(reconnects, "\n"))
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "Heal verdict") && strings.Contains(line, foreign) && strings.Contains(line, `verdict="repaired"`) {
			t.Errorf("a teardown repair of foreign ran: %s", line)
		}
	}
	l.sh(t, "umount "+mnt)
}
