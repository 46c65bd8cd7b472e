package fshealth

import (
	"fmt"
	"strings"
	"time"

	"github.com/pathmend/pathmend/pkg/volume"
)

// State is what a staged filesystem is now.
type State string

const (
	// Healthy: nothing says the filesystem is not taking writes or has
	// recorded errors.
	Healthy State = "healthy"
	// Errors: the filesystem recorded errors and still takes writes (ext4
	// with errors=continue, or errors recorded before it was staged).
	Errors State = "errors"
	// ReadOnly: a filesystem staged read-write takes no writes: ext4 after
	// an error with errors=remount-ro, or a mount the kernel (or anyone)
	// made read-only.
	ReadOnly State = "read_only"
	// Shutdown: the filesystem has shut down; every read and write fails
	// (XFS after a log or metadata I/O error).
	Shutdown State = "shutdown"
	// Unknown: its health cannot be read (nothing mounted at the staging
	// path, a sysfs attribute missing, a filesystem pathmend does not
	// check). Never reported as a defect; the metric says it.
	Unknown State = "unknown"
)

// States are every State, in the order the metric lists them.
var States = []State{Healthy, Errors, ReadOnly, Shutdown, Unknown}

// Condition reasons, stable: alerts and scripts match them.
const (
	// ReasonReadOnly: the filesystem takes no writes.
	ReasonReadOnly = "FilesystemReadOnly"
	// ReasonShutdown: the filesystem has shut down.
	ReasonShutdown = "FilesystemShutdown"
	// ReasonErrors: the filesystem recorded errors and still takes writes.
	ReasonErrors = "FilesystemErrors"
)

// Fact is the name a staged volume's filesystem health is kept under in
// the node model's facts (pkg/model): the loop writes it each tick, the
// health RPCs read it.
const Fact = "filesystem"

// Runbook anchors in docs/operations.md, named in every message.
const (
	runbookReadOnly = "docs/operations.md#pathmendfilesystemreadonly"
	runbookErrors   = "docs/operations.md#pathmendfilesystemerrors"
)

// ErrorRecord is one of ext4's recorded errors (the first or the last):
// when, and in which kernel function.
type ErrorRecord struct {
	// Time is fs/ext4/<dev>/{first,last}_error_time (seconds); zero when
	// none is recorded.
	Time time.Time
	// Func is fs/ext4/<dev>/{first,last}_error_func, e.g.
	// "ext4_journal_check_start".
	Func string
}

// Health is what the reader found of one staged filesystem.
type Health struct {
	State State
	// FSType is the mounted filesystem's type (the mount table's).
	FSType string
	// Device is the kernel's name of the mounted block device ("nvme0n1",
	// "dm-2"); Number its device number. Empty/zero when unknown.
	Device string
	Number volume.DeviceNumber
	// Errors is ext4's errors_count; First and Last its recorded errors.
	Errors      int64
	First, Last ErrorRecord
	// Behavior is ext4's errors= behaviour in force ("remount-ro",
	// "continue", "panic"); empty when not read or not ext4.
	Behavior string
	// Detail says what made the state: "errors=remount-ro", "a stat of
	// the staging mount answers EIO", "mount options ro", or why the
	// state is unknown.
	Detail string
}

// Abnormal reports whether the filesystem is a defect to report.
func (h Health) Abnormal() bool {
	return h.State == Errors || h.State == ReadOnly || h.State == Shutdown
}

// Condition is the volume condition of h: Inaccessible for ReadOnly and
// Shutdown, Degraded for Errors, Healthy (no condition) otherwise. The
// message names the device, the error count, the first error's time and
// what to do, within the bound Kubernetes keeps.
func (h Health) Condition() volume.Condition {
	switch h.State {
	case ReadOnly:
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonReadOnly, Message: h.message()}
	case Shutdown:
		return volume.Condition{Status: volume.Inaccessible, Reason: ReasonShutdown, Message: h.message()}
	case Errors:
		return volume.Condition{Status: volume.Degraded, Reason: ReasonErrors, Message: h.message()}
	}
	return volume.Condition{Status: volume.Healthy}
}

// Summary says in one line what h is, for logs, diagnose and the
// per-node messages: "ext4 on nvme0n1 (259:1): read-only after 7 errors
// since 2026-12-04T17:35:19Z".
func (h Health) Summary() string {
	var b strings.Builder
	b.WriteString(h.what())
	b.WriteString(": ")
	switch h.State {
	case ReadOnly:
		b.WriteString("read-only")
		if h.Errors > 0 {
			fmt.Fprintf(&b, " after %s", h.errorsSince())
		}
	case Shutdown:
		b.WriteString("shut down")
	case Errors:
		fmt.Fprintf(&b, "%s, still writable", h.errorsSince())
	case Healthy:
		b.WriteString("healthy")
	default:
		b.WriteString("health unknown")
	}
	if h.Detail != "" {
		fmt.Fprintf(&b, " (%s)", h.Detail)
	}
	return b.String()
}

// what names the filesystem: "ext4 on nvme0n1 (259:1)".
func (h Health) what() string {
	fsType := h.FSType
	if fsType == "" {
		fsType = "filesystem"
	}
	switch {
	case h.Device != "" && !h.Number.IsZero():
		return fmt.Sprintf("%s on %s (%s)", fsType, h.Device, h.Number)
	case h.Device != "":
		return fmt.Sprintf("%s on %s", fsType, h.Device)
	}
	return fsType
}

// errorsSince renders "7 errors since 2026-12-04T17:35:19Z".
func (h Health) errorsSince() string {
	s := fmt.Sprintf("%d error", h.Errors)
	if h.Errors != 1 {
		s += "s"
	}
	if !h.First.Time.IsZero() {
		s += " since " + h.First.Time.UTC().Format(time.RFC3339)
	}
	return s
}

// errorDetail renders the recorded errors: "7 errors (the first at
// 2026-12-04T17:35:19Z in ext4_wait_block_bitmap, the last at … in …)".
func (h Health) errorDetail() string {
	s := fmt.Sprintf("%d error", h.Errors)
	if h.Errors != 1 {
		s += "s"
	}
	var parts []string
	if r := renderRecord(h.First); r != "" {
		parts = append(parts, "the first "+r)
	}
	if r := renderRecord(h.Last); r != "" && h.Last != h.First {
		parts = append(parts, "the last "+r)
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

func renderRecord(r ErrorRecord) string {
	if r.Time.IsZero() {
		return ""
	}
	s := "at " + r.Time.UTC().Format(time.RFC3339)
	if r.Func != "" {
		s += " in " + r.Func
	}
	return s
}

// message is the condition's message: what, since when, and what to do.
func (h Health) message() string {
	var b strings.Builder
	b.WriteString(h.what())
	switch h.State {
	case ReadOnly:
		if h.Errors > 0 {
			fmt.Fprintf(&b, " is read-only after %s", h.errorDetail())
			if h.Behavior != "" {
				fmt.Fprintf(&b, " with errors=%s", h.Behavior)
			}
			b.WriteString(": every write fails with EROFS, whatever the mount table says")
		} else {
			fmt.Fprintf(&b, " is mounted read-only (%s) though the volume was staged read-write: every write fails", h.Detail)
		}
		fmt.Fprintf(&b, ". pathmend never remounts it read-write: restart the volume's pods; when none uses it any more, NodeUnstage and the next NodeStage check it (fsck -p) and mount it again (%s)", runbookReadOnly)
	case Shutdown:
		fmt.Fprintf(&b, " has shut down (%s): every read and write fails. pathmend never remounts it: restart the volume's pods; when none uses it any more, NodeUnstage and the next NodeStage mount it again, which replays its log (%s)", h.Detail, runbookReadOnly)
	case Errors:
		fmt.Fprintf(&b, " recorded %s and still takes writes", h.errorDetail())
		if h.Detail != "" {
			fmt.Fprintf(&b, " (%s)", h.Detail)
		}
		fmt.Fprintf(&b, ": its metadata may be damaged. Restart the volume's pods soon: the next NodeStage checks it (fsck -p) before mounting it (%s)", runbookErrors)
	}
	return b.String()
}
