// Package nvmeheal is the NVMe-oF/TCP transport as the loop (pkg/monitor)
// drives it: its plan, its one job, and what it reports into the node
// model. It knows no gRPC and no loop: it implements the Transport
// interface pkg/monitor declares, with pkg/model's values.
//
// # Plan
//
// Each tick the transport reads sysfs once through the nvme.Reader it
// keeps (nvme.ScopePaths; nvme.ScopeAll when the foreign scope needs the
// connect options of learned controllers) and plans, without a lock,
// which subsystems need a job:
//
//   - owned scope (a staged-volume record names the subsystem): a defect
//     nvme.Inspect finds, a missing path of a staged volume that is not
//     backed off (or is, for not answering: the job rechecks it with a
//     short probe), a controller whose timeouts are not yet aligned with
//     its volumes' (or a head not yet looked at);
//   - foreign scope (no record names it): after learning from the read
//     (companion.Learner: every endpoint seen, the options it was
//     connected with), a defect of a learned subsystem, or a learned
//     endpoint to connect again.
//
// # The one job
//
// Job runs on one subsystem with its lease. It re-reads the subsystem's
// records under the lease and decides from them whose it is now: a
// record (any state, or an unreadable file that may be its) makes it the
// node plugin's; none, a learned subsystem of the foreign scope. Either
// way the job is: repair (Mend: a fresh read, nvme.Inspect, the heal
// policy, nvme.Repairer) — every teardown refused while a record that may
// be the subsystem's cannot be read; in the foreign scope every namespace
// counts as in use and the repairs run only when enabled — then connect
// again what is missing (the staged volumes' endpoints, optimized first,
// with their contexts' options and a live sibling's DH-HMAC-CHAP keys; or
// the learned endpoints the kernel gave up or the repair tore down, with
// the learned options), then align the staged volumes' controller
// timeouts. Mend is also the attach-time repair: the NVMe attacher
// (pkg/nvme/attach) calls it on the one subsystem whose lease its
// NodeStage holds.
//
// One per-endpoint backoff (heal.Backoff) spaces out what costs — a
// probe without an answer, a connect that failed — whatever scope the
// endpoint is in; a refusal is retried every tick.
//
// # Report
//
// Finish turns the tick's read (read again when a job changed the
// kernel) into model.Volumes: per staged volume its expected endpoints
// (live, down, absent, with the controller and the kernel's words),
// condition (nvme.ConditionOf), the devices its namespace has now and
// the tick's notes (a deferred repair, a backed-off endpoint, a busy
// target); per learned subsystem, in the foreign scope, its learned
// endpoints. The node's conditions are the endpoints of staged volumes
// that do not answer (EndpointsUnreachable, TargetUnreachable).
// RefreshTarget does the same for the staged volumes of one subsystem.
//
// # Invariants
//
// The transport keeps no intent: records come from the intent owner,
// learned endpoints from the state dir. Plan and Finish are called by one
// loop, one tick at a time; jobs run concurrently on different
// subsystems. It starts no goroutine of its own.
package nvmeheal
