package driver_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// failMounter fails every Mount while failures > 0; mounted are the
// options of each mount it made.
type failMounter struct {
	*mountstest.Table
	failures int
	mounted  [][]string
}

func (m *failMounter) Mount(source, target, fstype string, options []string) error {
	if m.failures > 0 {
		m.failures--
		return errors.New("mount: wrong fs type, bad option, bad superblock")
	}
	if err := m.Table.Mount(source, target, fstype, options); err != nil {
		return err
	}
	m.mounted = append(m.mounted, slices.Clone(options))
	return nil
}

// checkStage stages an existing filesystem (blkid says fsType) through a
// driver whose tools answer as tools says, and returns the stage's error,
// the commands run and the mounter's log.
func checkStage(t *testing.T, fsType string, readOnly, xfsRepair bool, mountFailures int, tools func(argv []string) iscsitest.Result) ([]string, *failMounter, error) {
	t.Helper()
	dir := t.TempDir()
	store, err := volume.NewStore(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	ex := &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		if argv[0] == "blkid" {
			return iscsitest.Result{Out: "TYPE=" + fsType + "\n"}
		}
		return tools(argv)
	}}
	fm := &failMounter{Table: mountstest.New(), failures: mountFailures}
	cfg := testConfig(fsType)
	cfg.XFSRepair = xfsRepair
	fa := &fakeAttacher{device: filepath.Join(dir, "dev-fake")}
	d, err := driver.New(cfg, withTable(driver.Deps{
		SysFS: sysfs.New(dir), Intents: ownerOf(t, store), Exec: utilexec.New(),
		Mounter:   &mount.SafeFormatAndMount{Interface: fm, Exec: ex},
		Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: fa, volume.TransportISCSI: fa},
	}, fm.Table))
	if err != nil {
		t.Fatal(err)
	}
	cap := mountCap(fsType, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if readOnly {
		cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	}
	_, err = d.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol-a", StagingTargetPath: mkdir(t, dir, "staging"), VolumeCapability: cap, VolumeContext: nvmeContext()})
	var cmds []string
	for _, c := range ex.Calls() {
		if c[0] != "blkid" {
			cmds = append(cmds, strings.Join(c, " "))
		}
	}
	return cmds, fm, err
}

func mountOptions(fm *failMounter) []string {
	if len(fm.mounted) == 0 {
		return nil
	}
	return fm.mounted[len(fm.mounted)-1]
}

// An existing ext4 is checked with fsck -p before a read-write mount; the
// exit status decides: clean or corrected mounts, errors left or a check
// that did not run mounts nothing and says what to do; a missing fsck is
// an error, never a skipped check. A read-only stage runs no check.
func TestStage_TheCheckBeforeTheMountDecides(t *testing.T) {
	fsck := func(code int, out string, err error) func([]string) iscsitest.Result {
		return func(argv []string) iscsitest.Result {
			if argv[0] != "fsck" {
				t.Errorf("unexpected command %v", argv)
			}
			return iscsitest.Result{Code: code, Out: out, Err: err}
		}
	}
	tests := []struct {
		name     string
		code     int
		out      string
		err      error
		readOnly bool
		want     codes.Code
		msg      []string
	}{
		{name: "clean", out: "/dev/x: clean, 12/65536 files", want: codes.OK},
		{name: "corrected", code: 1, out: "/dev/x contains a file system with errors, check forced.", want: codes.OK},
		{name: "corrected, reboot advised", code: 2, want: codes.OK},
		{name: "errors left", code: 4, out: "/dev/x: UNEXPECTED INCONSISTENCY; RUN fsck MANUALLY.\n\t(i.e., without -a or -p options)", want: codes.FailedPrecondition,
			msg: []string{"fsck -p exit 4", "UNEXPECTED INCONSISTENCY", "e2fsck -f", "pathmend mounts nothing", "docs/operations.md#the-check-at-nodestage-failed"}},
		{name: "the check could not run", code: 8, out: "fsck.ext4: Device or resource busy while trying to open /dev/x", want: codes.Internal, msg: []string{"fsck -p exit 8", "Device or resource busy"}},
		{name: "no fsck", err: utilexec.ErrExecutableNotFound, want: codes.FailedPrecondition, msg: []string{"fsck is not installed"}},
		{name: "read-only stage", readOnly: true, code: 4, want: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmds, fm, err := checkStage(t, "ext4", tc.readOnly, false, 0, fsck(tc.code, tc.out, tc.err))
			st := status.Convert(statusOf(err))
			if st.Code() != tc.want {
				t.Fatalf("stage: %v, want %v", err, tc.want)
			}
			for _, s := range tc.msg {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("message lacks %q: %s", s, st.Message())
				}
			}
			wantCmds := 1
			if tc.readOnly {
				wantCmds = 0
			}
			if len(cmds) != wantCmds || (len(cmds) == 1 && !strings.HasPrefix(cmds[0], "fsck -p ")) {
				t.Errorf("commands %q, want one fsck -p (none for a read-only stage)", cmds)
			}
			mounted := len(fm.mounted) > 0
			if mounted != (tc.want == codes.OK) {
				t.Errorf("mounted %t with the stage answering %v", mounted, st.Code())
			}
			if mounted && !tc.readOnly && !slices.Contains(mountOptions(fm), "errors=remount-ro") {
				t.Errorf("ext4 mounted with %v, want errors=remount-ro", mountOptions(fm))
			}
		})
	}
}

// An XFS is not checked before its mount (the mount replays the log).
// When its mount fails and xfs_repair -n finds damage, pathmend repairs it
// only with --xfs-repair, never with -L.
func TestStage_XFSIsRepairedOnlyWhenAllowed(t *testing.T) {
	tools := func(argv []string) iscsitest.Result {
		switch strings.Join(argv, " ") {
		case "xfs_repair -n " + argv[len(argv)-1]:
			return iscsitest.Result{Code: 1, Out: "agf_freeblks 1234, counted 1200 in ag 0\nwould have reset inode 131 nlinks"}
		}
		if argv[0] == "xfs_repair" {
			return iscsitest.Result{Out: "done"}
		}
		t.Errorf("unexpected command %v", argv)
		return iscsitest.Result{Code: 1}
	}
	cmds, _, err := checkStage(t, "xfs", false, false, 0, tools)
	if err != nil || len(cmds) != 0 {
		t.Errorf("a healthy XFS: %v, commands %q", err, cmds)
	}
	cmds, fm, err := checkStage(t, "xfs", false, false, 1, tools)
	if st := status.Convert(statusOf(err)); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "only with --xfs-repair") || !strings.Contains(st.Message(), "agf_freeblks") {
		t.Errorf("a damaged XFS without --xfs-repair: %v", err)
	}
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "xfs_repair -n ") || len(fm.mounted) != 0 {
		t.Errorf("without --xfs-repair: commands %q, mounts %v", cmds, fm.mounted)
	}
	cmds, fm, err = checkStage(t, "xfs", false, true, 1, tools)
	if err != nil || len(cmds) != 2 || !strings.HasPrefix(cmds[1], "xfs_repair /") || len(fm.mounted) != 1 {
		t.Errorf("with --xfs-repair: %v, commands %q, mounts %v", err, cmds, fm.mounted)
	}
	for _, c := range cmds {
		if strings.Contains(c, " -L") {
			t.Errorf("ran %q", c)
		}
	}
}
