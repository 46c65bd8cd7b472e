package blockuse

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// tree builds a sysfs root holding block/<dev> directories the way the
// kernel lays them out: dev, holders/, and a subdirectory per partition
// with partition, dev and holders/.
type tree struct {
	t    *testing.T
	root string
}

func newTree(t *testing.T) *tree {
	return &tree{t: t, root: t.TempDir()}
}

func (tr *tree) write(rel, content string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o444); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) mkdir(rel string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.root, rel), 0o755); err != nil {
		tr.t.Fatal(err)
	}
}

// disk adds block/<name> with number and holders.
func (tr *tree) disk(name, number string, holders ...string) {
	tr.write("block/"+name+"/dev", number)
	tr.write("block/"+name+"/size", "131072")
	tr.mkdir("block/" + name + "/holders")
	tr.mkdir("block/" + name + "/queue")
	for _, h := range holders {
		tr.write("block/"+name+"/holders/"+h, "")
	}
}

// part adds partition <disk>/<name> with number and holders.
func (tr *tree) part(disk, name, number string, holders ...string) {
	d := "block/" + disk + "/" + name
	tr.write(d+"/partition", strings.TrimPrefix(name, disk))
	tr.write(d+"/dev", number)
	tr.mkdir(d + "/holders")
	for _, h := range holders {
		tr.write(d+"/holders/"+h, "")
	}
}

func (tr *tree) fs() sysfs.FS { return sysfs.New(tr.root) }

// table writes mountinfo lines to a file and returns a MountTable of it.
func table(t *testing.T, lines ...string) MountTable {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return MountInfoFile(p)
}

const (
	rootLine = "22 1 0:21 / / rw,relatime shared:1 - rootfs rootfs rw"
	devLine  = "23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=1000k,mode=755"
)

// TestInUse_ByKind: each kind of use the node shows, one at a time, on a
// tree laid out as the kernel does it.
func TestInUse_ByKind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		build  func(*tree)
		mounts []string
		dev    string
		in     bool
		why    string
	}{
		{"unused", func(tr *tree) { tr.disk("sdb", "8:16") }, []string{rootLine, devLine}, "sdb", false,
			"sdb is not held, mounted or bound anywhere on the node"},
		{"mounted by number", func(tr *tree) { tr.disk("sdb", "8:16") },
			[]string{rootLine, "40 22 8:16 / /var/lib/kubelet/plugins/x/globalmount rw,relatime shared:9 - ext4 /dev/sdb rw"}, "sdb", true,
			"sdb is mounted at /var/lib/kubelet/plugins/x/globalmount"},
		{"mounted twice (bind into a pod)", func(tr *tree) { tr.disk("sdb", "8:16") },
			[]string{rootLine, "40 22 8:16 / /stage rw - xfs /dev/sdb rw", "41 22 8:16 / /pods/a/vol rw - xfs /dev/sdb rw"}, "sdb", true,
			"sdb is mounted at /stage; sdb is mounted at /pods/a/vol"},
		{"btrfs: anonymous number, source names the device", func(tr *tree) { tr.disk("sdb", "8:16") },
			[]string{rootLine, "40 22 0:48 / /data rw - btrfs /dev/sdb rw"}, "sdb", true, "sdb is mounted at /data"},
		{"a partition mounted", func(tr *tree) { tr.disk("sdb", "8:16"); tr.part("sdb", "sdb1", "8:17"); tr.part("sdb", "sdb2", "8:18") },
			[]string{rootLine, "40 22 8:18 / /data rw - ext4 /dev/sdb2 rw"}, "sdb", true, "sdb2 is mounted at /data"},
		{"held by a map", func(tr *tree) { tr.disk("sdb", "8:16", "dm-3") }, []string{rootLine}, "sdb", true, "sdb is held by dm-3"},
		{"a partition held", func(tr *tree) { tr.disk("sdb", "8:16"); tr.part("sdb", "sdb1", "8:17", "md0") }, []string{rootLine}, "sdb", true,
			"sdb1 is held by md0"},
		{"a map mounted by its mapper name", func(tr *tree) { tr.disk("dm-3", "254:3"); tr.write("block/dm-3/dm/name", "mpatha") },
			[]string{rootLine, "40 22 0:49 / /data rw - btrfs /dev/mapper/mpatha rw"}, "dm-3", true, "dm-3 is mounted at /data"},
		{"the device node bound (a block volume published)", func(tr *tree) { tr.disk("sdb", "8:16") },
			[]string{rootLine, devLine, "45 22 0:5 /sdb /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv/pod rw - devtmpfs udev rw"}, "sdb", true,
			"the device node of sdb is bound at /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv/pod"},
		{"another device's node bound", func(tr *tree) { tr.disk("sdb", "8:16") },
			[]string{rootLine, devLine, "45 22 0:5 /sdbb /x rw - devtmpfs udev rw", "46 22 0:5 /sdb /y rw - tmpfs tmpfs rw"}, "sdb", false,
			"sdb is not held, mounted or bound anywhere on the node"},
		{"not a partition: a directory of the disk named like one", func(tr *tree) { tr.disk("sdb", "8:16"); tr.mkdir("block/sdb/sdb_stats") },
			[]string{rootLine}, "sdb", false, "sdb is not held, mounted or bound anywhere on the node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			tc.build(tr)
			in, why := New(tr.fs(), table(t, tc.mounts...)).InUse(tc.dev)
			if in != tc.in || why != tc.why {
				t.Errorf("InUse(%s) = %v, %q; want %v, %q", tc.dev, in, why, tc.in, tc.why)
			}
		})
	}
}

// TestInUse_FailsClosed: whatever cannot be read makes the device in use.
func TestInUse_FailsClosed(t *testing.T) {
	tr := newTree(t)
	tr.disk("sdb", "8:16")
	tr.disk("sdc", "garbage")
	tr.write("block/sdd/dev", "8:48") // no holders directory
	tr.disk("sde", "8:64")
	for i := 0; i <= MaxPartitions+1; i++ {
		tr.part("sde", fmt.Sprintf("sde%d", i+1), fmt.Sprintf("259:%d", i))
	}
	good := table(t, rootLine)
	for _, tc := range []struct {
		name   string
		dev    string
		mounts MountTable
		why    string
	}{
		{"no such device", "sdz", good, "cannot tell whether sdz is in use: read block/sdz/dev: "},
		{"a path, not a name", "../sdb", good, `cannot tell whether "../sdb" is in use: not a block device name`},
		{"empty name", "", good, `cannot tell whether "" is in use: not a block device name`},
		{"unparsable number", "sdc", good, "cannot tell whether sdc is in use: parse block/sdc/dev: "},
		{"holders unreadable", "sdd", good, "cannot tell whether sdd is in use: list block/sdd/holders: "},
		{"too many partitions", "sde", good, fmt.Sprintf("cannot tell whether sde is in use: block/sde has more than %d partitions", MaxPartitions)},
		{"no mount table", "sdb", nil, "cannot tell whether sdb is in use: no mount table"},
		{"mount table unreadable", "sdb", func() ([]mount.MountInfo, error) { return nil, errors.New("permission denied") },
			"cannot tell whether sdb is in use: mount table: permission denied"},
		{"mount table missing", "sdb", MountInfoFile(filepath.Join(t.TempDir(), "none")), "cannot tell whether sdb is in use: mount table: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, why := New(tr.fs(), tc.mounts).InUse(tc.dev)
			if !in || !strings.HasPrefix(why, tc.why) {
				t.Errorf("InUse(%q) = %v, %q; want in use, %q…", tc.dev, in, why, tc.why)
			}
		})
	}
}

// TestInUse_OnLabCaptures: the real sysfs trees of the lab. A disk of a
// multipath map is held by it; the map itself is in use only when the
// node shows it.
func TestInUse_OnLabCaptures(t *testing.T) {
	dir := t.TempDir()
	if err := sysfstest.Materialize("../../testdata/fixtures/iscsi-healthy.sysfs", dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	fsys := sysfs.New(dir)
	for _, tc := range []struct {
		dev    string
		mounts []string
		in     bool
		why    string
	}{
		{"sda", []string{rootLine}, true, "sda is held by dm-0"},
		{"dm-0", []string{rootLine}, false, "dm-0 is not held, mounted or bound anywhere on the node"},
		{"dm-0", []string{rootLine, "50 22 254:0 / /mnt/vol rw - ext4 /dev/mapper/36001405576cc50fe2cb48818a080ab8f rw"}, true, "dm-0 is mounted at /mnt/vol"},
	} {
		in, why := New(fsys, table(t, tc.mounts...)).InUse(tc.dev)
		if in != tc.in || why != tc.why {
			t.Errorf("InUse(%s) with %d mounts = %v, %q; want %v, %q", tc.dev, len(tc.mounts), in, why, tc.in, tc.why)
		}
	}
}

// TestInUse_OnTheLabsMountTable: the host mount table the lab's e2e test
// (TestBlockUse_ReadsMountsHoldersAndBindsOfARealDisk) kept while the
// second partition of its loop disk was mounted, over a tree with the
// numbers the kernel gave them there (loop0 7:0, loop0p1 259:2, loop0p2
// 259:3).
func TestInUse_OnTheLabsMountTable(t *testing.T) {
	tr := newTree(t)
	tr.disk("loop0", "7:0")
	tr.part("loop0", "loop0p1", "259:2")
	tr.part("loop0", "loop0p2", "259:3")
	tr.disk("loop1", "7:1")
	r := New(tr.fs(), MountInfoFile("testdata/lab-mountinfo"))
	for dev, want := range map[string]struct {
		in  bool
		why string
	}{
		"loop0": {true, "loop0p2 is mounted at /tmp/TestBlockUse_ReadsMountsHoldersAndBindsOfARealDisk2531401548/001/m"},
		"loop1": {false, "loop1 is not held, mounted or bound anywhere on the node"},
	} {
		if in, why := r.InUse(dev); in != want.in || why != want.why {
			t.Errorf("InUse(%s) = %v, %q; want %v, %q", dev, in, why, want.in, want.why)
		}
	}
}
