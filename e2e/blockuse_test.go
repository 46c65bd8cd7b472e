//go:build e2e

package e2e

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/blockuse"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// TestBlockUse_ReadsMountsHoldersAndBindsOfARealDisk checks the node's
// in-use test (pkg/blockuse) on the real kernel with a loop disk: unused,
// a partition mounted, a device-mapper table over it (holders, and the
// map's own mount by its dm number), its device node bound as a
// block-mode volume's would be. It keeps the host's mount table of the
// mounted step in the lab's out directory (the unit tests' real
// mountinfo comes from it).
func TestBlockUse_ReadsMountsHoldersAndBindsOfARealDisk(t *testing.T) {
	l := needLab(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, twoPartitionDisk(16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	loop := l.sh(t, `modprobe loop
d=$(losetup -f -P --show `+img+`)
basename "$d"`)
	t.Cleanup(func() {
		l.trySh(t, time.Minute, `umount -q `+dir+`/m 2>/dev/null; umount -q `+dir+`/b 2>/dev/null; dmsetup remove pathmend-blockuse 2>/dev/null; losetup -d /dev/`+loop+` || true`)
	})
	l.sh(t, "udevadm settle -t 10 || true; mkdir -p "+dir+"/m; touch "+dir+"/b")
	r := blockuse.New(sysfs.New("/sys"), blockuse.MountInfoFile("/proc/1/mountinfo"))
	check := func(dev string, want bool, whyHas string) {
		t.Helper()
		in, why := r.InUse(dev)
		t.Logf("InUse(%s) = %v, %q", dev, in, why)
		if in != want || !strings.Contains(why, whyHas) {
			t.Errorf("InUse(%s) = %v, %q; want %v, containing %q", dev, in, why, want, whyHas)
		}
	}
	check(loop, false, "is not held, mounted or bound anywhere")

	// A partition mounted: the disk is in use through it.
	l.sh(t, "mkfs.ext4 -q -F /dev/"+loop+"p2 && mount /dev/"+loop+"p2 "+dir+"/m")
	check(loop, true, loop+"p2 is mounted at "+dir+"/m")
	mi, err := os.ReadFile("/proc/1/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(l.dir, "out", "blockuse-mountinfo")
	if err := os.WriteFile(out, mi, 0o644); err != nil {
		t.Logf("keep the mount table: %v", err)
	}
	t.Logf("numbers: %s", l.sh(t, "for d in /sys/block/"+loop+" /sys/block/"+loop+"/"+loop+"p*; do echo \"${d##*/} $(cat $d/dev)\"; done | tr '\\n' ' '"))
	l.sh(t, "umount "+dir+"/m")
	check(loop, false, "is not held")

	// A device-mapper table over a partition: held; the map mounted.
	dm := l.sh(t, `dmsetup create pathmend-blockuse --table "0 $(blockdev --getsz /dev/`+loop+`p2) linear /dev/`+loop+`p2 0"
udevadm settle -t 10 || true
basename "$(readlink -f /dev/mapper/pathmend-blockuse)"`)
	check(loop, true, loop+"p2 is held by "+dm)
	check(dm, false, "is not held")
	l.sh(t, "mount /dev/mapper/pathmend-blockuse "+dir+"/m")
	check(dm, true, dm+" is mounted at "+dir+"/m")
	l.sh(t, "umount "+dir+"/m && dmsetup remove pathmend-blockuse && udevadm settle -t 10 || true")
	check(loop, false, "is not held")

	// The device node bound, as NodePublish does for a block volume.
	l.sh(t, "mount --bind /dev/"+loop+" "+dir+"/b")
	check(loop, true, "the device node of "+loop+" is bound at "+dir+"/b")
	l.sh(t, "umount "+dir+"/b")
	check(loop, false, "is not held")

	// Unreadable: a device that is not there counts as in use.
	check("sdzz", true, "cannot tell")
}

// twoPartitionDisk is a disk image of size bytes with an MBR
// holding two Linux partitions: 8 MiB from sector 2048, and the rest.
// (The guest has no partitioning tool.)
func twoPartitionDisk(size int) []byte {
	b := make([]byte, size)
	sectors := uint32(size / 512)
	entry := func(i int, start, n uint32) {
		e := b[446+16*i:]
		e[4] = 0x83 // Linux
		binary.LittleEndian.PutUint32(e[8:], start)
		binary.LittleEndian.PutUint32(e[12:], n)
	}
	entry(0, 2048, 16384)
	entry(1, 2048+16384, sectors-2048-16384)
	b[510], b[511] = 0x55, 0xaa
	return b
}
