package sysfs

import (
	"fmt"
	"io/fs"
	"time"

	"golang.org/x/sys/unix"
)

// Identity tells the directory of one kernel object apart from any other
// directory that had, has or will have the same path: a controller that
// reuses the name nvme3, a session re-created after a logout. It is the
// device and inode number of the directory plus its mtime, from one
// statx.
//
// Why this is sound on sysfs: kernfs numbers every node it creates from a
// cyclic idr and keeps a generation counter in the upper 32 bits of the
// node's 64-bit id, bumped each time the idr wraps
// (fs/kernfs/dir.c:__kernfs_new_node, "kn->id = (u64)id_highbits << 32 |
// ret"). Where ino_t is 64 bits, that whole id is the inode number
// (include/linux/kernfs.h:kernfs_id_ino, since Linux 5.5; the generation
// starts at 0 there), so no two nodes of one boot ever share an inode
// number: a re-created directory always has a new one. Where ino_t is 32 bits, the inode number is the
// low half and repeats only after 2^31 further node allocations, and the
// mtime (set when the inode is instantiated) must repeat too. The mtime
// can also change while an object lives (kernfs re-instantiates an
// evicted inode with the current time); that only makes a miss, never a
// false match. kernfs does not touch a directory's times when children
// come and go, so a controller keeps its identity while its legs do.
//
// On the filesystems tests materialize trees on (ext4, tmpfs) an inode
// number freed by a removal can be handed to the next directory created,
// which is why sysfstest.Sync builds a re-created object's directory before
// it removes the old one, and checks the inode changed.
type Identity struct {
	Dev, Ino uint64
	// Mtime is nanoseconds since the epoch.
	Mtime int64
}

// ModTime is the directory's mtime, as os.Stat reports it.
func (id Identity) ModTime() time.Time { return time.Unix(0, id.Mtime) }

func identityOf(st *unix.Statx_t) Identity {
	return Identity{
		Dev:   unix.Mkdev(st.Dev_major, st.Dev_minor),
		Ino:   st.Ino,
		Mtime: st.Mtime.Sec*1e9 + int64(st.Mtime.Nsec),
	}
}

// Identity returns the identity of rel, following symlinks. A missing
// entry is an error that satisfies IsNotExist.
func (f FS) Identity(rel string) (Identity, error) {
	var st unix.Statx_t
	if err := ignoringEINTR(func() error { return unix.Statx(unix.AT_FDCWD, f.Path(rel), 0, statxMask, &st) }); err != nil {
		return Identity{}, fmt.Errorf("stat %s: %w", rel, &fs.PathError{Op: "statx", Path: f.Path(rel), Err: err})
	}
	return identityOf(&st), nil
}
