package fshealth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The attribute values below are the lab's (Debian 6.1.0-57): an ext4 on
// an NVMe/TCP head (nvme0n1, 259:1) before and after both target ports
// were away longer than fast_io_fail_tmo, with writes running.
var (
	ext4Healthy = map[string]string{
		"errors_count": "0", "first_error_time": "0", "first_error_func": "", "last_error_time": "0", "last_error_func": "",
		"delayed_allocation_blocks": "0",
	}
	ext4AfterOutage = map[string]string{
		"errors_count": "7", "first_error_time": "1796405719", "first_error_func": "ext4_wait_block_bitmap",
		"last_error_time": "1796405739", "last_error_func": "__ext4_new_inode", "delayed_allocation_blocks": "0",
	}
	// /proc/fs/ext4/<dev>/options of the same filesystem: one option a
	// line, defaults included.
	ext4Options = "rw\nbsddf\nnogrpid\nblock_validity\nnodioread_nolock\nnodiscard\ndelalloc\nnowarn_on_error\njournal_checksum\nbarrier\nauto_da_alloc\nuser_xattr\nacl\nnoquota\nresuid=0\nresgid=0\nerrors=%s\ncommit=5\nmin_batch_time=0\nmax_batch_time=15000\nstripe=0\ndata=ordered\ninode_readahead_blks=32\ninit_itable=10\nmax_dir_size_kb=0\n"
)

// node is a sysfs tree, a procfs tree and a mount table for one staged
// filesystem, shaped as the lab kernel has them.
type node struct {
	sys, proc, staging string
	lines              []string
	statErr            error
}

func newNode(t *testing.T) *node {
	t.Helper()
	dir := t.TempDir()
	n := &node{sys: filepath.Join(dir, "sys"), proc: filepath.Join(dir, "proc"), staging: filepath.Join(dir, "staging")}
	for _, d := range []string{n.sys, n.proc, n.staging} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// blockDev makes dev/block/<num> → the device's directory, as sysfs
// links it.
func (n *node) blockDev(t *testing.T, name, num string) {
	t.Helper()
	real := filepath.Join(n.sys, "devices/virtual/nvme-subsystem/nvme-subsys0", name)
	mustMkdir(t, real)
	write(t, filepath.Join(real, "dev"), num+"\n")
	mustMkdir(t, filepath.Join(n.sys, "dev/block"))
	if err := os.Symlink("../../devices/virtual/nvme-subsystem/nvme-subsys0/"+name, filepath.Join(n.sys, "dev/block", num)); err != nil {
		t.Fatal(err)
	}
}

func (n *node) ext4Attrs(t *testing.T, dev string, attrs map[string]string) {
	t.Helper()
	d := filepath.Join(n.sys, "fs/ext4", dev)
	mustMkdir(t, d)
	for k, v := range attrs {
		write(t, filepath.Join(d, k), v+"\n")
	}
}

func (n *node) ext4Options(t *testing.T, dev, behavior string) {
	t.Helper()
	d := filepath.Join(n.proc, "fs/ext4", dev)
	mustMkdir(t, d)
	write(t, filepath.Join(d, "options"), fmt.Sprintf(ext4Options, behavior))
}

// mount adds a mountinfo line for the staging path: "ext4 /dev/nvme0n1
// rw" as the lab's table shows it.
func (n *node) mount(num, opts, fsType, source, superOpts string) {
	n.lines = append(n.lines, fmt.Sprintf("%d 1 %s / %s %s - %s %s %s", 30+len(n.lines), num, n.staging, opts, fsType, source, superOpts))
}

func (n *node) table(t *testing.T) []mount.MountInfo {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mountinfo")
	base := "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
	write(t, p, base+strings.Join(n.lines, "\n")+"\n")
	infos, err := mount.ParseMountInfo(p)
	if err != nil {
		t.Fatal(err)
	}
	return infos
}

func (n *node) reader() *Reader {
	return New(sysfs.New(n.sys), n.proc, func(p string) (unix.Stat_t, error) {
		if p != n.staging {
			return unix.Stat_t{}, fmt.Errorf("stat of %s, not the staging mount %s", p, n.staging)
		}
		return unix.Stat_t{Blksize: 1024}, n.statErr
	})
}

func mustMkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

var staged = time.Date(2026, 12, 4, 17, 35, 10, 500e6, time.UTC)

func record(n *node, fsType string, readOnly bool) volume.Record {
	return volume.Record{VolumeID: "vol-a", StagingPath: n.staging, AccessType: volume.AccessMount, FSType: fsType, ReadOnly: readOnly, State: volume.StateStaged, StagedAt: staged}
}

func TestCheck_GradesWhatTheKernelPublishes(t *testing.T) {
	first := time.Unix(1796405719, 0).UTC()
	last := time.Unix(1796405739, 0).UTC()
	num := volume.DeviceNumber{Major: 259, Minor: 1}
	tests := []struct {
		name     string
		setup    func(t *testing.T, n *node)
		readOnly bool
		want     Health
	}{{
		name: "healthy ext4",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4Healthy)
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw,errors=remount-ro")
		},
		want: Health{State: Healthy, FSType: "ext4", Device: "nvme0n1", Number: num},
	}, {
		name: "ext4 after an outage: errors recorded, remount-ro, the mount table still says rw",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
			n.ext4Options(t, "nvme0n1", "remount-ro")
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw,errors=remount-ro")
		},
		want: Health{State: ReadOnly, FSType: "ext4", Device: "nvme0n1", Number: num, Errors: 7,
			First: ErrorRecord{Time: first, Func: "ext4_wait_block_bitmap"}, Last: ErrorRecord{Time: last, Func: "__ext4_new_inode"},
			Behavior: "remount-ro", Detail: "errors=remount-ro"},
	}, {
		name: "ext4 with errors=continue keeps writing: errors",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
			n.ext4Options(t, "nvme0n1", "continue")
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
		},
		want: Health{State: Errors, FSType: "ext4", Device: "nvme0n1", Number: num, Errors: 7,
			First: ErrorRecord{Time: first, Func: "ext4_wait_block_bitmap"}, Last: ErrorRecord{Time: last, Func: "__ext4_new_inode"},
			Behavior: "continue", Detail: "errors=continue: ext4 keeps writing after an error unless its journal aborted"},
	}, {
		name: "ext4 errors on a volume staged read-only: errors, not read-only",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
			n.ext4Options(t, "nvme0n1", "remount-ro")
			n.mount("259:1", "ro,relatime", "ext4", "/dev/nvme0n1", "ro,errors=remount-ro")
		},
		readOnly: true,
		want: Health{State: Errors, FSType: "ext4", Device: "nvme0n1", Number: num, Errors: 7,
			First: ErrorRecord{Time: first, Func: "ext4_wait_block_bitmap"}, Last: ErrorRecord{Time: last, Func: "__ext4_new_inode"},
			Behavior: "remount-ro", Detail: "staged read-only"},
	}, {
		name: "ext4 errors recorded before the staging: errors",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			attrs := map[string]string{"errors_count": "1", "first_error_time": "1796405000", "first_error_func": "trigger_test_error", "last_error_time": "1796405000", "last_error_func": "trigger_test_error"}
			n.ext4Attrs(t, "nvme0n1", attrs)
			n.ext4Options(t, "nvme0n1", "remount-ro")
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw,errors=remount-ro")
		},
		want: Health{State: Errors, FSType: "ext4", Device: "nvme0n1", Number: num, Errors: 1,
			First: ErrorRecord{Time: time.Unix(1796405000, 0).UTC(), Func: "trigger_test_error"}, Last: ErrorRecord{Time: time.Unix(1796405000, 0).UTC(), Func: "trigger_test_error"},
			Behavior: "remount-ro", Detail: "recorded before the volume was staged at 2026-12-04T17:35:10Z"},
	}, {
		name: "ext4 errors, options unreadable: read-only, pathmend's default behaviour",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "dm-2", "253:2")
			n.ext4Attrs(t, "dm-2", map[string]string{"errors_count": "2", "first_error_time": "1796405719", "last_error_time": "1796405719"})
			n.mount("253:2", "rw,relatime", "ext4", "/dev/mapper/mpatha", "rw,errors=remount-ro")
		},
		want: Health{State: ReadOnly, FSType: "ext4", Device: "dm-2", Number: volume.DeviceNumber{Major: 253, Minor: 2}, Errors: 2,
			First: ErrorRecord{Time: first}, Last: ErrorRecord{Time: first}},
	}, {
		name: "ext4 without errors_count: unknown, naming the attribute",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
		},
		want: Health{State: Unknown, FSType: "ext4", Device: "nvme0n1", Number: num},
	}, {
		name: "ext4 whose device is no longer in sysfs: unknown",
		setup: func(t *testing.T, n *node) {
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
		},
		want: Health{State: Unknown, FSType: "ext4", Device: "nvme0n1", Number: num, Detail: "device 259:1 is not in sysfs"},
	}, {
		name: "ext4 mounted read-only while staged read-write",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4Healthy)
			n.mount("259:1", "ro,relatime", "ext4", "/dev/nvme0n1", "rw")
		},
		want: Health{State: ReadOnly, FSType: "ext4", Device: "nvme0n1", Number: num, Detail: "mount options ro"},
	}, {
		name: "a superblock the kernel made read-only, with errors",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
			n.ext4Options(t, "nvme0n1", "continue")
			n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "ro")
		},
		want: Health{State: ReadOnly, FSType: "ext4", Device: "nvme0n1", Number: num, Errors: 7,
			First: ErrorRecord{Time: first, Func: "ext4_wait_block_bitmap"}, Last: ErrorRecord{Time: last, Func: "__ext4_new_inode"},
			Behavior: "continue", Detail: "superblock options ro"},
	}, {
		name: "read-only on purpose is no defect",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.ext4Attrs(t, "nvme0n1", ext4Healthy)
			n.mount("259:1", "ro,relatime", "ext4", "/dev/nvme0n1", "ro")
		},
		readOnly: true,
		want:     Health{State: Healthy, FSType: "ext4", Device: "nvme0n1", Number: num},
	}, {
		name: "xfs answering its stat: healthy",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.mount("259:1", "rw,relatime", "xfs", "/dev/nvme0n1", "rw,nouuid,attr2,inode64,logbufs=8,logbsize=32k,noquota")
		},
		want: Health{State: Healthy, FSType: "xfs", Device: "nvme0n1", Number: num},
	}, {
		name: "xfs answering EIO: shut down",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.mount("259:1", "rw,relatime", "xfs", "/dev/nvme0n1", "rw,nouuid,attr2,inode64,logbufs=8,logbsize=32k,noquota")
			n.statErr = unix.EIO
		},
		want: Health{State: Shutdown, FSType: "xfs", Device: "nvme0n1", Number: num, Detail: "a stat of its staging mount answers EIO"},
	}, {
		name: "xfs whose stat fails otherwise: unknown",
		setup: func(t *testing.T, n *node) {
			n.blockDev(t, "nvme0n1", "259:1")
			n.mount("259:1", "rw,relatime", "xfs", "/dev/nvme0n1", "rw")
			n.statErr = unix.EACCES
		},
		want: Health{State: Unknown, FSType: "xfs", Device: "nvme0n1", Number: num},
	}, {
		name:  "nothing mounted at the staging path: unknown",
		setup: func(t *testing.T, n *node) {},
		want:  Health{State: Unknown, FSType: "ext4"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			tc.setup(t, n)
			got := n.reader().Check(record(n, tc.want.FSType, tc.readOnly), n.table(t))
			// Details of unknown states carry paths and errors: checked
			// for naming what failed, then compared without.
			if tc.want.State == Unknown && tc.want.Detail == "" {
				if got.Detail == "" {
					t.Errorf("unknown state says nothing of why")
				}
				got.Detail = ""
			}
			if tc.want.Detail == "" && tc.want.State == ReadOnly && tc.want.Errors > 0 {
				if !strings.HasPrefix(got.Detail, "errors behaviour unknown: ") {
					t.Errorf("detail %q: want the unknown behaviour named", got.Detail)
				}
				got.Detail = ""
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Check (-want +got):\n%s", diff)
			}
			c := got.Condition()
			if len(c.Message) > 1024 {
				t.Errorf("message is %d bytes, over the 1024 Kubernetes keeps: %s", len(c.Message), c.Message)
			}
			if got.Abnormal() != c.Abnormal() {
				t.Errorf("Abnormal %t, condition %v", got.Abnormal(), c.Status)
			}
		})
	}
}

func TestCheck_ErrorsCountMissingNamesThePath(t *testing.T) {
	n := newNode(t)
	n.blockDev(t, "nvme0n1", "259:1")
	n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
	got := n.reader().Check(record(n, "ext4", false), n.table(t))
	if got.State != Unknown || !strings.Contains(got.Detail, "fs/ext4/nvme0n1/errors_count") {
		t.Errorf("got %s %q, want unknown naming fs/ext4/nvme0n1/errors_count", got.State, got.Detail)
	}
}

func TestCheck_ABlockVolumeIsNeverRead(t *testing.T) {
	n := newNode(t)
	rec := record(n, "", false)
	rec.AccessType = volume.AccessBlock
	r := New(sysfs.New(n.sys), n.proc, func(string) (unix.Stat_t, error) { t.Error("a block volume was stat'ed"); return unix.Stat_t{}, nil })
	if got := r.Check(rec, n.table(t)); got.State != Unknown || got.Abnormal() {
		t.Errorf("block volume: %+v", got)
	}
}

func TestCheck_FindsTheMountOfASymlinkedStagingPath(t *testing.T) {
	n := newNode(t)
	n.blockDev(t, "nvme0n1", "259:1")
	n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
	n.ext4Options(t, "nvme0n1", "remount-ro")
	n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(n.staging, link); err != nil {
		t.Fatal(err)
	}
	rec := record(n, "ext4", false)
	rec.StagingPath = link
	if got := n.reader().Check(rec, n.table(t)); got.State != ReadOnly {
		t.Errorf("through a symlink: %s (%s), want read_only", got.State, got.Detail)
	}
}

func TestCheck_TheTopmostMountCounts(t *testing.T) {
	n := newNode(t)
	n.blockDev(t, "nvme0n1", "259:1")
	n.blockDev(t, "nvme1n1", "259:5")
	n.ext4Attrs(t, "nvme0n1", ext4AfterOutage)
	n.ext4Options(t, "nvme0n1", "remount-ro")
	n.ext4Attrs(t, "nvme1n1", ext4Healthy)
	n.mount("259:1", "rw,relatime", "ext4", "/dev/nvme0n1", "rw")
	n.mount("259:5", "rw,relatime", "ext4", "/dev/nvme1n1", "rw")
	if got := n.reader().Check(record(n, "ext4", false), n.table(t)); got.State != Healthy || got.Device != "nvme1n1" {
		t.Errorf("stacked mounts: %s on %s, want healthy on nvme1n1 (the top one)", got.State, got.Device)
	}
}

func TestCondition_SaysWhatWhenAndWhatToDo(t *testing.T) {
	h := Health{State: ReadOnly, FSType: "ext4", Device: "nvme0n1", Number: volume.DeviceNumber{Major: 259, Minor: 1}, Errors: 7,
		First:    ErrorRecord{Time: time.Unix(1796405719, 0), Func: "ext4_wait_block_bitmap"},
		Last:     ErrorRecord{Time: time.Unix(1796405739, 0), Func: "__ext4_new_inode"},
		Behavior: "remount-ro", Detail: "errors=remount-ro"}
	c := h.Condition()
	if c.Status != volume.Inaccessible || c.Reason != ReasonReadOnly {
		t.Fatalf("condition %v %s", c.Status, c.Reason)
	}
	for _, want := range []string{"nvme0n1 (259:1)", "7 errors", "2026-12-04T17:35:19Z", "ext4_wait_block_bitmap", "errors=remount-ro", "EROFS", "restart the volume's pods", "fsck -p", runbookReadOnly} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message lacks %q: %s", want, c.Message)
		}
	}
	if got, want := h.Summary(), "ext4 on nvme0n1 (259:1): read-only after 7 errors since 2026-12-04T17:35:19Z (errors=remount-ro)"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}

	sd := Health{State: Shutdown, FSType: "xfs", Device: "dm-3", Number: volume.DeviceNumber{Major: 253, Minor: 3}, Detail: "a stat of its staging mount answers EIO"}
	c = sd.Condition()
	if c.Status != volume.Inaccessible || c.Reason != ReasonShutdown {
		t.Fatalf("shutdown condition %v %s", c.Status, c.Reason)
	}
	for _, want := range []string{"xfs on dm-3 (253:3)", "EIO", "replays its log", runbookReadOnly} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("shutdown message lacks %q: %s", want, c.Message)
		}
	}

	e := Health{State: Errors, FSType: "ext4", Device: "nvme0n1", Errors: 1, First: ErrorRecord{Time: time.Unix(1796405719, 0)}, Last: ErrorRecord{Time: time.Unix(1796405719, 0)}, Detail: "errors=continue: ext4 keeps writing after an error unless its journal aborted"}
	c = e.Condition()
	if c.Status != volume.Degraded || c.Reason != ReasonErrors || !strings.Contains(c.Message, "1 error (the first at 2026-12-04T17:35:19Z)") || !strings.Contains(c.Message, runbookErrors) {
		t.Errorf("errors condition %v %s: %s", c.Status, c.Reason, c.Message)
	}
	for _, s := range []State{Healthy, Unknown} {
		if c := (Health{State: s}).Condition(); c.Abnormal() || c.Reason != "" {
			t.Errorf("%s: condition %+v", s, c)
		}
	}
}

func TestCheck_XFSShutdownIsEIOOnly(t *testing.T) {
	wrapped := fmt.Errorf("stat: %w", unix.EIO)
	n := newNode(t)
	n.blockDev(t, "nvme0n1", "259:1")
	n.mount("259:1", "rw", "xfs", "/dev/nvme0n1", "rw")
	n.statErr = wrapped
	if got := n.reader().Check(record(n, "xfs", false), n.table(t)); got.State != Shutdown {
		t.Errorf("wrapped EIO: %s", got.State)
	}
	n.statErr = errors.New("something else")
	if got := n.reader().Check(record(n, "xfs", false), n.table(t)); got.State != Unknown {
		t.Errorf("other error: %s", got.State)
	}
}
