// Package iscsi is pathmend's iSCSI transport below the CSI layer: a read
// model of the kernel's iSCSI state from sysfs, an Initiator that drives
// open-iscsi through iscsiadm, and the SessionHealer that gets sessions
// stuck out of LOGGED_IN back. The CSI attacher built on it lives in
// package attach. Neither imports pkg/driver or pkg/monitor.
//
// # What it reads
//
// Read takes one Snapshot from a sysfs.FS; a Reader takes one again and
// again (the session heal keeps one), reading what iscsid fixes for a
// session's life (its class link, target name, TPGT, iface, persistent
// portal) and a map's dm UUID once per object, under the sysfs.Identity
// of its directory, and everything else every time
// (docs/performance.md). Nothing else in the package reads sysfs. The
// layout, as captured from Linux 6.1 in pathmend's lab:
//
//	class/iscsi_session/sessionN -> devices/platform/hostH/sessionN/iscsi_session/sessionN
//	    state            LOGGED_IN | FAILED | FREE                    (required)
//	    targetname       the target IQN                               (required)
//	    tpgt             target portal group tag                      (required)
//	    recovery_tmo     seconds blocked before transport-offline     (required)
//	    target_id        SCSI target id, for scanning one LUN         (optional)
//	    ifacename, initiatorname                                      (optional; "(null)" is empty)
//	class/iscsi_connection/connectionN:C -> devices/platform/hostH/sessionN/connectionN:C/iscsi_connection/connectionN:C
//	    state            up | down | failed | bound                   (required)
//	    persistent_address, persistent_port: the session's portal    (required)
//	    address, port    current portal; ENOTCONN while down          (read only when up)
//	class/iscsi_host/hostH                                            (listed)
//	devices/platform/hostH/sessionN/targetH:C:T/H:C:T:L               one per LUN
//	    state            running | blocked | transport-offline | …    (required)
//	    wwid             the kernel's LUN identifier                  (optional)
//	    vpd_pg83         raw VPD page 0x83, when wwid is absent       (optional)
//	    block/sdX/{size,holders/}                                     (when the disk is bound)
//	block/dm-N -> devices/virtual/block/dm-N
//	    dm/uuid          "mpath-…" marks a dm-multipath map; others are skipped
//	    dm/name, size, slaves/, holders/
//
// A required attribute that is missing is an error naming its path; an
// object whose class link disappears during the read (a logout racing it)
// is left out. The password, username and other CHAP attributes of a
// session are never read. The kernel publishes no timestamp for a state
// change (the mtimes of these files never move), so how long a session has
// been down is measured by the observer: the SessionHealer's clocks.
//
// # Diagnosis
//
// Inspect turns one Snapshot plus the staged volumes into typed findings
// (heal.Defect with what they rest on): SessionDown for a session out of
// LOGGED_IN, LUNNotRunning for a LUN the kernel blocked or offlined under
// a LOGGED_IN session, MapDegraded for a multipath map with fewer live
// slaves than its target has sessions (and which session or LUN defects
// it follows from). Only states the kernel shows are defects: the healthy
// lab capture yields none (TestInspect_HealthyCaptureHasNoDefect).
// `pathmend diagnose` reports them; the loop counts SessionDown in the
// defects metric.
//
// # What it writes and runs
//
// The only sysfs write of this package is a scan of exactly one LUN,
// "C T L" to class/scsi_host/hostH/scan (Initiator.Rescan). The attacher
// writes device/delete and device/rescan of a LUN's disks. Nothing ever
// writes recovery_tmo: the kernel refuses it with EBUSY on a FAILED or
// FREE session, and an accepted write does not re-arm a running timer
// (docs/iscsi.md).
//
// Host commands run through k8s.io/utils/exec behind a configurable prefix
// (nsenter, chroot) so that a containerized plugin runs the host's tools:
// iscsiadm for node records, discovery, login and logout; multipath -f to
// remove a map (the kernel has no sysfs interface for it); multipathd
// resize map; and the configured iscsid restart command. iscsiadm's exit
// codes (open-iscsi's include/iscsi_err.h) become typed errors; its output
// is never parsed. CHAP secrets travel in iscsiadm's argv (it reads values
// nowhere else) and are redacted from every log line and error.
//
// # In use
//
// The heal's ladder (ChooseKick) logs a session out only when no LUN of
// it loses a device in use: every LUN has another live path in its
// multipath map, or its device is in use neither on the node (a
// DeviceUse, *blockuse.Reader on a node: mounted, held, its device node
// bound; unreadable counts as in use) nor by a staged volume. The same
// test applies to every target, staged or foreign; without a DeviceUse a
// LUN of a target no staged volume uses counts as in use.
//
// # What the heal owes and reports
//
// A logout + login whose login fails leaves its node record without a
// session, which iscsid does not retry: the SessionHealer records that
// debt and keeps logging the record in, once per cooldown, reported as an
// absent session (Report.Owed) whatever the heal scope, until it is
// LOGGED_IN, its record is deleted, or (for a target of staged volumes)
// none of them is staged any more. The time to LOGGED_IN of a kick counts
// from the kick's start. NodeConditions turns a tick's reports into the
// node's storage conditions: targets or portals that do not answer, and
// sessions the heal cannot kick, with what an operator can do.
//
// # Invariants
//
// Snapshots are values: nothing mutates one after Read returns it
// (successive snapshots of one Reader share what did not change). The
// Initiator, the SessionHealer and the attacher are built once per
// process, start no goroutine in their constructors and are safe for
// concurrent use. The heal is transport-neutral in its policy pieces
// (pkg/heal: modes, verdicts, streaks, the once-per-window budget, the log
// gate) and iSCSI-specific only in what it observes and which kick it
// chooses.
package iscsi
