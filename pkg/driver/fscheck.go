package driver

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/volume"
)

// The check before the mount.
//
// A filesystem that recorded errors — ext4 after "Remounting filesystem
// read-only", the usual end of a path outage longer than the kernel
// queues for — must be checked before it is written again. pathmend never
// remounts one read-write in place: the pods are restarted, kubelet
// unpublishes and unstages the volume, and NodeStage checks the
// filesystem before it mounts it:
//
//   - ext2, ext3, ext4: `fsck -p` (e2fsck's preen: it replays the journal
//     and, when the superblock records errors — read first, and logged
//     at level 0 when it does — checks the whole
//     filesystem and makes the repairs that need no decision), run before
//     every read-write mount of an existing filesystem, as mount-utils'
//     SafeFormatAndMount runs `fsck -a`. Unlike SafeFormatAndMount,
//     pathmend mounts nothing when the check did not finish clean or
//     corrected: exit 4 (errors left) and exit 8 and above (the check
//     could not run) fail the stage with the device and what to do, and a
//     missing fsck is an error, never a skipped check;
//   - xfs: nothing before the mount, which replays the log. xfs_repair
//     runs only with Config.XFSRepair, and only after a mount failed and
//     `xfs_repair -n` found damage; never with -L (zeroing the log loses
//     its last transactions: the operator's decision).
//
// A read-only stage runs no check: it writes nothing, and e2fsck's
// repairs would write.

// e2fsck's exit statuses (fsck(8) passes them through): 1 and 2 say
// errors were corrected (2 asks for a reboot when the root filesystem was
// checked mounted; a staged volume is not mounted during the check).
const (
	fsckCorrected       = 1
	fsckCorrectedReboot = 2
	fsckUncorrected     = 4
)

// checkFilesystem runs the check of rec's existing filesystem (format, as
// blkid reads it) before a read-write mount.
func (d *Driver) checkFilesystem(rec volume.Record, format string) error {
	switch format {
	case "ext2", "ext3", "ext4":
	default:
		return nil
	}
	// What the superblock records says why the check matters (it reads
	// 1 KiB of a device whose paths the attach just found live); the
	// check itself decides either way.
	recorded := ""
	if sb, err := readSuperblock(rec.Device); err == nil && sb.RecordsErrors() {
		recorded = sb.Summary()
		klog.InfoS("Filesystem records errors: checking it before mounting", "volumeID", rec.VolumeID, "device", rec.Device, "fsType", format, "recorded", recorded, "journalNeedsRecovery", sb.NeedsRecovery)
	}
	out, err := d.deps.Mounter.Exec.Command("fsck", "-p", rec.Device).CombinedOutput()
	var ee utilexec.ExitError
	switch {
	case err == nil && recorded != "":
		klog.InfoS("Filesystem check cleared the recorded errors before mounting", "volumeID", rec.VolumeID, "device", rec.Device, "fsType", format, "output", lastLines(out))
		return nil
	case err == nil:
		klog.V(2).InfoS("Filesystem checked before mounting", "volumeID", rec.VolumeID, "device", rec.Device, "fsType", format, "output", lastLines(out))
		return nil
	case errors.Is(err, utilexec.ErrExecutableNotFound):
		return failedPrecondition("volume %s: fsck is not installed: %s on %s must be checked before it is mounted read-write; install e2fsprogs and util-linux where pathmend runs", rec.VolumeID, format, rec.Device)
	case errors.As(err, &ee) && (ee.ExitStatus() == fsckCorrected || ee.ExitStatus() == fsckCorrectedReboot):
		klog.InfoS("Filesystem check corrected errors before mounting", "volumeID", rec.VolumeID, "device", rec.Device, "fsType", format, "exitStatus", ee.ExitStatus(), "output", lastLines(out))
		return nil
	case errors.As(err, &ee) && ee.ExitStatus() == fsckUncorrected:
		klog.InfoS("Filesystem check left errors: not mounting", "volumeID", rec.VolumeID, "device", rec.Device, "fsType", format, "output", lastLines(out))
		return failedPrecondition("volume %s: the check of %s on %s found errors it may not repair without a decision (fsck -p exit 4): %s. pathmend mounts nothing: with the volume's pods stopped, attach the volume on a node by hand and run e2fsck -f on its device (it asks before each repair), or restore the volume from a backup; then the next NodeStage mounts it (docs/operations.md#the-check-at-nodestage-failed)",
			rec.VolumeID, format, rec.Device, lastLines(out))
	case errors.As(err, &ee):
		return internal(nil, "volume %s: the check of %s on %s did not run to the end (fsck -p exit %d): %s; pathmend mounts nothing unchecked (docs/operations.md#the-check-at-nodestage-failed)",
			rec.VolumeID, format, rec.Device, ee.ExitStatus(), lastLines(out))
	}
	return internal(err, "volume %s: run fsck -p %s", rec.VolumeID, rec.Device)
}

// mountExisting mounts rec's existing filesystem (format) at its staging
// path. An XFS whose mount fails is repaired and mounted once more when
// Config.XFSRepair allows it and `xfs_repair -n` finds damage.
func (d *Driver) mountExisting(rec volume.Record, format string, opts []string) error {
	opts = append(opts, "defaults") // as SafeFormatAndMount mounts
	err := d.deps.Mounter.Mount(rec.Device, rec.StagingPath, rec.FSType, opts)
	if err == nil {
		return nil
	}
	if format != "xfs" || rec.ReadOnly {
		return internal(err, "mount %s at %s", rec.Device, rec.StagingPath)
	}
	// xfs_repair -n changes nothing: exit 1 says it found damage.
	out, nerr := d.deps.Mounter.Exec.Command("xfs_repair", "-n", rec.Device).CombinedOutput()
	var ee utilexec.ExitError
	if nerr == nil || !errors.As(nerr, &ee) || ee.ExitStatus() != 1 {
		return internal(err, "mount %s at %s (xfs_repair -n finds no damage it can name: %s)", rec.Device, rec.StagingPath, errString(nerr))
	}
	if !d.cfg.XFSRepair {
		return failedPrecondition("volume %s: xfs on %s does not mount (%v) and xfs_repair -n finds damage: %s. pathmend repairs only with --xfs-repair; with the volume's pods stopped, run xfs_repair %s on this node (never -L unless losing the log's last transactions is acceptable), then the next NodeStage mounts it (docs/operations.md#the-check-at-nodestage-failed)",
			rec.VolumeID, rec.Device, err, lastLines(out), rec.Device)
	}
	klog.InfoS("Repairing an XFS that does not mount (--xfs-repair)", "volumeID", rec.VolumeID, "device", rec.Device, "mountErr", err.Error(), "found", lastLines(out))
	out, rerr := d.deps.Mounter.Exec.Command("xfs_repair", rec.Device).CombinedOutput()
	if rerr != nil {
		return failedPrecondition("volume %s: xfs_repair %s failed (%v): %s; pathmend never runs it with -L: decide on the node (docs/operations.md#the-check-at-nodestage-failed)", rec.VolumeID, rec.Device, rerr, lastLines(out))
	}
	klog.InfoS("Repaired an XFS before mounting", "volumeID", rec.VolumeID, "device", rec.Device, "output", lastLines(out))
	if err := d.deps.Mounter.Mount(rec.Device, rec.StagingPath, rec.FSType, opts); err != nil {
		return internal(err, "mount %s at %s after xfs_repair", rec.Device, rec.StagingPath)
	}
	return nil
}

// lastLines keeps the end of a tool's output for a log line or an error:
// its last 5 lines, at most 512 bytes, on one line.
func lastLines(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	s := strings.Join(lines, " | ")
	if len(s) > 512 {
		s = "…" + s[len(s)-512:]
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return "exit 0"
	}
	return fmt.Sprint(err)
}

// readSuperblock reads the ext2/3/4 superblock of device.
func readSuperblock(device string) (fshealth.Superblock, error) {
	f, err := os.Open(device)
	if err != nil {
		return fshealth.Superblock{}, err
	}
	defer f.Close()
	return fshealth.ReadSuperblock(f)
}
