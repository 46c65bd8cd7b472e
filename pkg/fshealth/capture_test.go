package fshealth

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// On the lab's capture (testdata/fixtures/fs-health: three namespaces of
// one subsystem, nvme0n1 ext4 after ext4's error knob, nvme0n2 a healthy
// ext4, nvme0n3 an XFS, all mounted), with the mount table the scenario
// made: the ext4 that recorded errors is read-only, the healthy ext4 and
// the XFS answering its stat are healthy — no false positive on the
// healthy volumes of the same subsystem.
func TestCheck_OnTheLabCapture(t *testing.T) {
	root := t.TempDir()
	if err := sysfstest.Materialize(filepath.Join("../../testdata/fixtures", "fs-health.sysfs"), root, time.Now()); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "fs/ext4/nvme0n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "fs/ext4/nvme0n1/options"), []byte(fmt.Sprintf(ext4Options, "remount-ro")), 0o644); err != nil {
		t.Fatal(err)
	}
	staging := map[string]string{"vol-1": t.TempDir(), "vol-2": t.TempDir(), "vol-3": t.TempDir()}
	table := filepath.Join(t.TempDir(), "mountinfo")
	lines := fmt.Sprintf("40 1 259:1 / %s rw,relatime - ext4 /dev/nvme0n1 rw,errors=remount-ro\n", staging["vol-1"]) +
		fmt.Sprintf("41 1 259:3 / %s rw,relatime - ext4 /dev/nvme0n2 rw,errors=remount-ro\n", staging["vol-2"]) +
		fmt.Sprintf("42 1 259:5 / %s rw,relatime - xfs /dev/nvme0n3 rw,nouuid,attr2,inode64,logbufs=8,logbsize=32k,noquota\n", staging["vol-3"])
	if err := os.WriteFile(table, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	infos, err := mount.ParseMountInfo(table)
	if err != nil {
		t.Fatal(err)
	}
	r := New(sysfs.New(root), proc, func(string) (unix.Stat_t, error) { return unix.Stat_t{Blksize: 4096}, nil })
	staged := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC) // before the capture's error
	want := map[string]State{"vol-1": ReadOnly, "vol-2": Healthy, "vol-3": Healthy}
	for id, st := range want {
		rec := volume.Record{VolumeID: id, StagingPath: staging[id], AccessType: volume.AccessMount, State: volume.StateStaged, StagedAt: staged}
		h := r.Check(rec, infos)
		if h.State != st {
			t.Errorf("%s: %s (%s), want %s", id, h.State, h.Detail, st)
		}
		if id == "vol-1" && (h.Device != "nvme0n1" || h.Errors != 3 || h.First.Func != "trigger_test_error" || h.Behavior != "remount-ro") {
			t.Errorf("vol-1: %+v", h)
		}
	}
}
