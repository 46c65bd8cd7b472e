// Package iscsiheal is the iSCSI transport as the loop (pkg/monitor)
// drives it: its plan, its one job, and what it reports into the node
// model. It knows no gRPC and no loop: it implements the Transport
// interface pkg/monitor declares, with pkg/model's values.
//
// Each tick Plan reads the iSCSI state once through the iscsi.Reader it
// keeps and hands it to the session heal (iscsi.SessionHealer.Plan),
// which updates its clocks, probes the portals of down sessions and
// decides on each stuck one: the node-wide iscsid restart, which belongs
// to no target, runs there; the logins and relogins it allows make their
// target need a job. Job, under the target's lease, runs them
// (SessionHealer.Kick: each re-checked against the target's records under
// the lease). Finish settles the tick (SessionHealer.Settle: a busy
// target's kicks deferred, the others awaiting LOGGED_IN) and reports:
//
//   - per staged iSCSI volume, its portals (live, down, absent, with the
//     session and why), its condition (iscsi.Grade) and the devices its
//     LUN has now (its disks and the multipath map over them);
//   - in the foreign scope, per target no record names, its sessions;
//   - the node's conditions (iscsi.NodeConditions: portals that do not
//     answer, sessions the heal cannot kick), the sessions down
//     (SessionDown, in scope or not, as `pathmend diagnose` counts them)
//     and every decided verdict, for the metrics.
//
// In the foreign scope alone (`pathmend companion`) the heal is skipped
// while a staged-volume record cannot be read: any session may be the
// node plugin's. RefreshTarget reads and reports the staged volumes of
// one target.
package iscsiheal
