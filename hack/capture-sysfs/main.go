// Command capture-sysfs snapshots the parts of a sysfs tree pathmend reads
// into a fixture file (the text format of pkg/sysfs/sysfstest), or prints a readable
// summary of a node's NVMe-oF and iSCSI topology.
//
// What is captured, relative to the sysfs root:
//
//   - class/nvme, class/nvme-subsystem, class/iscsi_host,
//     class/iscsi_session, class/iscsi_connection and block/{nvme*,dm-*,sd*}:
//     the class links themselves and, followed, the real device
//     directories under devices/ they point at, to a bounded depth
//     (controllers with their hidden legs nvmeXcYnZ, subsystems with their
//     namespace heads and multipath/ links, the iSCSI host and session
//     devices with the session → target → LUN → block/sdX walk, dm-N with
//     dm/, slaves/ and holders/);
//   - module/nvme_core/parameters/multipath.
//
// Below a followed device, power/, queue/, mq/, trace/, integrity/,
// bsg/, scsi_generic/, firmware_node, uevent, NVMe generic char devices
// (ngXnY) and hwmon nodes are left out. Symlinks inside captured
// directories are recorded, not followed. Write-only attributes
// (delete_controller, reset_controller, rescan_controller) are recorded as
// wo entries without a value; an attribute whose read fails (address of a
// down iSCSI connection) is recorded with its errno name. Directory mtimes
// are recorded as ages relative to the capture time.
//
// Host identities — the values of hostnqn, hostid and initiatorname — are
// replaced everywhere by stable fakes unless -no-sanitize is given. Target
// NQNs and IQNs are kept.
//
// Usage:
//
//	capture-sysfs [-root /sys] [-o file] [-comment text]... [-kernel release]
//	capture-sysfs -summary [-root /sys | -fixture file]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

type commentFlags []string

func (c *commentFlags) String() string     { return strings.Join(*c, "; ") }
func (c *commentFlags) Set(v string) error { *c = append(*c, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout, time.Now); err != nil {
		fmt.Fprintln(os.Stderr, "capture-sysfs:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer, now func() time.Time) error {
	fl := flag.NewFlagSet("capture-sysfs", flag.ContinueOnError)
	root := fl.String("root", "/sys", "sysfs root to read")
	out := fl.String("o", "", "write the fixture to this file instead of standard output")
	kernel := fl.String("kernel", "", "kernel release for the header (default: uname -r when -root is /sys)")
	noSanitize := fl.Bool("no-sanitize", false, "keep host identities (hostnqn, hostid, initiatorname)")
	summaryMode := fl.Bool("summary", false, "print a readable topology summary instead of a fixture")
	fixture := fl.String("fixture", "", "with -summary: summarize this fixture file instead of -root")
	var comments commentFlags
	fl.Var(&comments, "comment", "header comment line (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	t := now()

	if *summaryMode {
		dir := *root
		if *fixture != "" {
			tmp, err := os.MkdirTemp("", "capture-sysfs-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			if err := sysfstest.Materialize(*fixture, tmp, t); err != nil {
				return err
			}
			dir = tmp
		}
		return summarize(stdout, sysfs.New(dir), t)
	}

	f, err := capture(*root, t)
	if err != nil {
		return err
	}
	f.Comments = append(f.Comments, comments...)
	rel := *kernel
	if rel == "" && (*root == "/sys" || *root == "/sys/") {
		var u unix.Utsname
		if unix.Uname(&u) == nil {
			rel = unix.ByteSliceToString(u.Release[:])
		}
	}
	if rel != "" {
		f.Comments = append(f.Comments, "kernel: "+rel)
	}
	// Credentials are redacted always, -no-sanitize or not.
	redactSecrets(f)
	if !*noSanitize {
		if kinds := sanitize(f); len(kinds) > 0 {
			f.Comments = append(f.Comments, "sanitized: "+strings.Join(kinds, ", ")+" replaced by stable fakes")
		}
	}
	w := stdout
	if *out != "" {
		fh, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer fh.Close()
		w = fh
	}
	if err := f.Encode(w); err != nil {
		return err
	}
	if fh, ok := w.(*os.File); ok && *out != "" {
		return fh.Close()
	}
	return nil
}
