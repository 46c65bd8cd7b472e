package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Unmount only what is ours. NodeUnpublishVolume and NodeUnstageVolume
// take a path from the caller; pathmend unmounts there only what it can
// tell is the volume's:
//
//   - a path the volume's record names (its staging path, one of its
//     publications) holds the volume's mounts;
//   - any other path holds the volume's mount when what is mounted there
//     is the volume's device or its staging mount (a bind made by a
//     NodePublish that crashed before recording it).
//
// A mount of anything else is refused with FailedPrecondition and left
// alone, as is the file or directory under it; a path with nothing mounted
// is left alone and the call succeeds, as csi-sanity and kubelet's retries
// expect.

// holdsVolume reports whether the topmost mount at path is of rec's
// device or of its staging mount: by the mount table's source (a bind of
// the staging mount shows the device it came from), or by device number
// (a filesystem on the device, or the device node bound onto a file for
// block access). A record without a device, or whose device is gone, can
// prove nothing.
func (d *Driver) holdsVolume(rec volume.Record, path string) (bool, error) {
	src, _, err := mountDevice(d.deps.Mounter, path)
	if err != nil {
		return false, err
	}
	if src != "" && ((rec.Device != "" && sameFile(src, rec.Device)) || (rec.StagingPath != "" && sameFile(src, rec.StagingPath))) {
		return true, nil
	}
	if rec.Device == "" {
		return false, nil
	}
	var dev, at unix.Stat_t
	if err := unix.Stat(rec.Device, &dev); err != nil || dev.Mode&unix.S_IFMT != unix.S_IFBLK {
		return false, nil
	}
	if err := unix.Stat(path, &at); err != nil {
		return false, nil
	}
	if at.Mode&unix.S_IFMT == unix.S_IFBLK {
		return at.Rdev == dev.Rdev, nil
	}
	return at.Dev == dev.Rdev, nil
}

// unmountOurs unmounts path layer by layer for as long as ours says the
// topmost mount is the volume's. It returns whether it unmounted anything.
// A foreign mount on top is refused with refusal; one left below the
// volume's layers stays, and the caller leaves the path alone.
func (d *Driver) unmountOurs(ctx context.Context, volumeID, path string, ours func() (bool, error), refusal func() error) (unmounted bool, err error) {
	for range maxUnmountLayers {
		mounted, err := isMountPoint(d.deps.Mounter, path)
		if err != nil {
			return unmounted, internal(err, "check mount at %s", path)
		}
		if !mounted {
			return unmounted, nil
		}
		ok, err := ours()
		if err != nil {
			return unmounted, internal(err, "inspect mount at %s", path)
		}
		if !ok {
			if unmounted {
				klog.InfoS("A mount that is not the volume's stays under the unmounted layers", "path", path)
				return true, nil
			}
			return false, refusal()
		}
		if err := d.unmount(ctx, volumeID, path); err != nil {
			return unmounted, err
		}
		unmounted = true
	}
	return unmounted, internal(nil, "%s still mounted after %d unmounts", path, maxUnmountLayers)
}

// releaseTarget undoes the publication of a volume at target: unmounts
// what is the volume's there and removes the file or directory
// NodePublishVolume made. hasRecord says whether rec was read; recorded
// whether rec lists target as a publication.
func (d *Driver) releaseTarget(ctx context.Context, volumeID string, rec volume.Record, hasRecord, recorded bool, target string) error {
	ours := func() (bool, error) {
		switch {
		case recorded:
			return true, nil
		case !hasRecord:
			return false, nil
		}
		return d.holdsVolume(rec, target)
	}
	refusal := func() error {
		return failedPrecondition("target path %s holds a mount that is not a publication of volume %s; it is left alone", quoteShort(target), volumeID)
	}
	unmounted, err := d.unmountOurs(ctx, volumeID, target, ours, refusal)
	if err != nil {
		return err
	}
	if !recorded && !unmounted {
		klog.V(2).InfoS("Unpublish of a path that holds no publication of the volume: nothing to do", "volumeID", volumeID, "targetPath", target)
		return nil
	}
	mounted, err := isMountPoint(d.deps.Mounter, target)
	if err != nil {
		return internal(err, "check mount at %s", target)
	}
	if mounted {
		return nil // a foreign mount left below the volume's: leave the path
	}
	// os.Remove deletes a file (block target) or an empty directory
	// (filesystem target), never anything with content.
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return internal(err, "remove target path %s", target)
	}
	return nil
}

// unstageUnrecorded answers a NodeUnstageVolume of a volume without a
// record: with nothing mounted at the staging path there is nothing to do;
// a mount there is not known to be pathmend's and is left alone.
func (d *Driver) unstageUnrecorded(volumeID, staging string) error {
	mounted, err := isMountPoint(d.deps.Mounter, staging)
	if err != nil {
		return internal(err, "check mount at %s", staging)
	}
	if mounted {
		return failedPrecondition("volume %s has no staged-volume record on this node; the mount at staging path %s is not known to be its and is left alone", volumeID, quoteShort(staging))
	}
	klog.V(2).InfoS("Unstage of a volume with no record: nothing to detach", "volumeID", volumeID, "stagingPath", staging)
	return nil
}
