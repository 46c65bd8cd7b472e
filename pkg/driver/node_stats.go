package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/volume"
)

// NodeGetCapabilities lists the Node RPCs pathmend implements.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	}
	caps := make([]*csi.NodeServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo reports the node ID, the volume limit and, when configured,
// the node's topology segment.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID, MaxVolumesPerNode: d.cfg.MaxVolumesPerNode}
	if d.cfg.TopologyKey != "" {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{d.cfg.TopologyKey: d.cfg.TopologyValue}}
	}
	return resp, nil
}

// lookupVolumeAt returns the record of a volume staged or published at
// path, or NotFound. A raw block volume is also found at any node of its
// own device: kubelet asks for a block volume's stats at its global map
// path (plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod UID>), a
// bind mount of the published device that pathmend never made.
func (d *Driver) lookupVolumeAt(volumeID, path string) (volume.Record, os.FileInfo, error) {
	rec, err := d.deps.Intents.Get(volumeID)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return volume.Record{}, nil, notFound("volume %s is not staged on this node", volumeID)
	case err != nil:
		return volume.Record{}, nil, internal(err, "read record of volume %s", volumeID)
	}
	recorded := path == rec.StagingPath || slices.ContainsFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == path })
	if recorded {
		// A layer that is not the volume's at, on or over a recorded
		// path answers for itself, even when it hides the path.
		if _, err := d.volumeOnTop(rec, path); err != nil {
			return volume.Record{}, nil, err
		}
	}
	fi, err := os.Stat(path)
	switch {
	case recorded && errors.Is(err, syscall.EIO):
		// A shut-down filesystem answers EIO to a stat of its root: the
		// volume is there, and its filesystem's health says why.
		return rec, nil, nil
	case !recorded && (err != nil || !isVolumeDevice(rec, fi)):
		return volume.Record{}, nil, notFound("volume %s is not staged or published at %s", volumeID, path)
	case errors.Is(err, os.ErrNotExist):
		return volume.Record{}, nil, notFound("volume path %s does not exist", path)
	case err != nil:
		return volume.Record{}, nil, internal(err, "stat %s", path)
	}
	return rec, fi, nil
}

// isVolumeDevice reports whether fi is a node of rec's block device: a
// block volume's device, same device number.
func isVolumeDevice(rec volume.Record, fi os.FileInfo) bool {
	if rec.AccessType != volume.AccessBlock || rec.Device == "" || !isBlockDevice(fi) {
		return false
	}
	dev, err := os.Stat(rec.Device)
	if err != nil || !isBlockDevice(dev) {
		return false
	}
	a, okA := fi.Sys().(*syscall.Stat_t)
	b, okB := dev.Sys().(*syscall.Stat_t)
	return okA && okB && a.Rdev == b.Rdev
}

func isBlockDevice(fi os.FileInfo) bool {
	return fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}

// NodeGetVolumeStats reports capacity and inodes of a filesystem volume or
// the size of a block volume. Path health is reported by
// NodeGetVolumeHealth: CSI v1.13 removed the alpha VolumeCondition field
// from this response. A volume whose staged device the kernel replaced has
// no usage to report — its filesystem is on a removed device — so it is
// answered FailedPrecondition with what happened and what to do, which
// kubelet logs, instead of numbers that look normal.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	volumeID := req.GetVolumeId()
	path, err := volumePathOf(volumeID, req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	rec, _, err := d.lookupVolumeAt(volumeID, path)
	if err != nil {
		return nil, err
	}
	v := d.volumeHealth(ctx, rec, &mountCache{})
	if c := v.Condition; c.Reason == volume.ReasonStagedDeviceReplaced {
		return nil, failedPrecondition("%s", c.Message)
	}
	// A filesystem that takes no writes, or none at all, has no usage a
	// pod can count on: the answer says so (CSI v1.13 has no condition
	// field in this response; kubelet logs the error).
	if c, ok := filesystemFact(v); ok && (c.Reason == fshealth.ReasonReadOnly || c.Reason == fshealth.ReasonShutdown) {
		return nil, failedPrecondition("volume %s: %s", volumeID, c.Message)
	}
	// With no live path a statfs, or an open of the device, may wait in
	// the kernel (stall.go): only then is the mount table read to decide.
	paths := volumePaths{cond: v.Condition, model: v.Paths}
	stallCheck := func(mountPoint, op string) error {
		if !paths.noneLive() {
			return nil
		}
		return d.stallCheck(rec, paths, d.readMountTable(), mountPoint, op)
	}
	if rec.AccessType == volume.AccessBlock {
		if _, err := d.volumeOnTop(rec, path); err != nil {
			return nil, err
		}
		if err := stallCheck("", "an open of its device"); err != nil {
			return nil, err
		}
		var size int64
		err := d.calls.run(ctx, volumeID, "the size read of "+rec.Device, func() error {
			var err error
			size, err = blockDeviceSize(rec.Device)
			return err
		})
		if err != nil {
			return nil, kernelCallError(err, "read size of block device %s of volume %s", rec.Device, volumeID)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	mounted, err := d.volumeOnTop(rec, path)
	if err != nil {
		return nil, err
	}
	if !mounted {
		return nil, notFound("filesystem of volume %s is not mounted at %s", volumeID, path)
	}
	if err := stallCheck(path, "a statfs"); err != nil {
		return nil, err
	}
	var usage []*csi.VolumeUsage
	err = d.calls.run(ctx, volumeID, "the statfs of "+path, func() error {
		var err error
		usage, err = fsUsage(path)
		return err
	})
	if err != nil {
		return nil, kernelCallError(err, "statfs %s", path)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: usage}, nil
}

// kernelCallError returns the error of a kernel call: the coded error of
// one still waiting in the kernel as it is, anything else wrapped as
// Internal with context.
func kernelCallError(err error, format string, args ...any) error {
	var ce *codedError
	if errors.As(err, &ce) {
		return err
	}
	return internal(err, format, args...)
}

// volumeOnTop reports whether the volume's layer is the top of path, its
// staging path or one of its publications: a path where a layer that is
// not the volume's stands is FailedPrecondition naming it (its usage is
// not the volume's; a grow there would grow something else). A path the
// record does not name (a block volume's device node elsewhere) reports
// false.
func (d *Driver) volumeOnTop(rec volume.Record, path string) (bool, error) {
	v, err := d.layers()
	if err != nil {
		return false, err
	}
	var c claim
	switch i := slices.IndexFunc(rec.Publications, func(p volume.Publication) bool { return p.TargetPath == path }); {
	case path == rec.StagingPath:
		c = stagingClaim(rec)
	case i >= 0:
		c = publicationClaim(rec, rec.Publications[i], v)
	default:
		return false, nil
	}
	s := c.inspect(v)
	if s.foreign != nil {
		return false, foreignError(rec.VolumeID, c, s)
	}
	return len(s.stack) > 0, nil
}

// fsUsage reports bytes and inodes of the filesystem mounted at path.
func fsUsage(path string) ([]*csi.VolumeUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, err
	}
	bsize := st.Bsize
	total := int64(st.Blocks) * bsize
	avail := int64(st.Bavail) * bsize
	used := (int64(st.Blocks) - int64(st.Bfree)) * bsize
	return []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: total, Available: avail, Used: used},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files) - int64(st.Ffree)},
	}, nil
}

// blockDeviceSize returns the size of a block device: seeking to the end of
// a block device node yields its size in bytes.
func blockDeviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// NodeExpandVolume rescans the device through the volume's transport and
// grows the filesystem online to the new device size.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	volumeID := req.GetVolumeId()
	path, err := volumePathOf(volumeID, req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() != nil {
		if _, err := parseCapability(req.GetVolumeCapability(), d.cfg.DefaultFSType); err != nil {
			return nil, err
		}
	}
	release, err := d.locks.acquire(volumeID)
	if err != nil {
		return nil, err
	}
	defer release()

	rec, _, err := d.lookupVolumeAt(volumeID, path)
	if err != nil {
		return nil, err
	}
	att, err := d.attacher(rec.Context.Transport)
	if err != nil {
		return nil, err
	}
	// The filesystem grows at its mount point (xfs_growfs takes the
	// path): the volume's mounts must be on top of both paths.
	if _, err := d.volumeOnTop(rec, path); err != nil {
		return nil, err
	}
	if rec.AccessType == volume.AccessMount && path != rec.StagingPath {
		mounted, err := d.volumeOnTop(rec, rec.StagingPath)
		if err != nil {
			return nil, err
		}
		if !mounted {
			return nil, failedPrecondition("volume %s is not mounted at its staging path %s: stage it again before it is expanded", volumeID, quoteShort(rec.StagingPath))
		}
	}
	// The rescan and the grow read and write the device: with no live
	// path they would wait in the kernel (stall.go).
	mountPoint := ""
	if rec.AccessType == volume.AccessMount {
		mountPoint = rec.StagingPath
	}
	if err := d.stallCheckNow(ctx, rec, att, mountPoint, "a grow of the filesystem"); err != nil {
		return nil, err
	}
	size, err := att.Expand(ctx, rec)
	if err != nil {
		return nil, fmt.Errorf("rescan device of volume %s: %w", volumeID, err)
	}
	if required := req.GetCapacityRange().GetRequiredBytes(); required > 0 && size < required {
		return nil, failedPrecondition("device %s of volume %s is %d bytes after a rescan, less than the required %d: the volume has not grown on the storage system yet", rec.Device, volumeID, size, required)
	}
	if rec.AccessType == volume.AccessMount {
		resizer := mount.NewResizeFs(d.deps.Exec)
		err := d.calls.run(ctx, volumeID, "the grow of the filesystem on "+rec.Device, func() error {
			need, err := resizer.NeedResize(rec.Device, rec.StagingPath)
			if err != nil {
				return internal(err, "check filesystem size of volume %s", volumeID)
			}
			if need {
				if _, err := resizer.Resize(rec.Device, rec.StagingPath); err != nil {
					return internal(err, "grow filesystem of volume %s", volumeID)
				}
				klog.FromContext(ctx).V(2).Info("Grew filesystem", "volumeID", volumeID, "device", rec.Device, "sizeBytes", size)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
