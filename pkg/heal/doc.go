// Package heal is pathmend's transport-neutral repair policy.
//
// It owns the decision of whether a diagnosed defect may be repaired now:
// the heal mode (repair, observe, off), narrowest scope first, the co-tenant
// gate, cooldowns and the connect grace. It knows no transport: NVMe-oF and
// iSCSI diagnosis produce values this package decides on, and mechanism
// (tearing down a controller, logging out a session) lives with the
// transport.
//
// A Policy is built once per process and shared by attach-time repair, the
// loop's jobs and the iSCSI heal (which takes its mode from it and keeps
// its login and relogin cooldowns in the same table through Left and
// MarkAt). Backoff, the one per-key backoff of the process, spaces out the
// retries that cost (an NVMe endpoint that does not answer). For each
// Defect it decides, in this order:
//
//  1. off mode: nothing is diagnosed or decided;
//  2. a scope above the configured cap is refused;
//  3. the co-tenant gate: a teardown that would leave another namespace
//     with no accessible path is refused — except NoNamespace, whose
//     subsystem exports nothing to strand;
//  4. cooldown, keyed by Defect.Key: a key repaired within the cooldown is
//     deferred (a failed repair starts the cooldown too);
//  5. connect grace: a teardown including a controller younger than the
//     grace is deferred, and repaired once the window passes if the defect
//     persists; an unknown age does not count as young;
//  6. observe mode logs what it would tear down and touches nothing;
//     repair mode runs the teardown through the Repairer (the mechanism).
//
// A Repairer may also be a FirstStepper: a defect with a non-destructive
// first step (the NVMe rescan of a missing namespace) gets it in repair
// mode whatever the rules above decide about its teardown — a rescan
// strands nobody — under a cooldown of its own (the same duration, key
// "<key> (first step)"). A first step that cures the defect is its repair;
// otherwise the teardown verdict stands, and the verdict line names the
// step (firstStep) and is logged even when the verdict did not change.
//
// Defects are handled narrowest scope first, and one whose paths an
// earlier repair of the same pass already removed is skipped. At most one
// teardown runs per pass: every defect of a pass was inspected on one
// read taken before its first teardown, so a second teardown's co-tenant
// check would be stale; it is decided again on the next read. Every
// verdict is logged once at level 0 with stable keys (verdict, defect,
// scope, key, controllers, coTenants, volumes, reason, mode); a deferral or
// refusal repeating unchanged tick after tick is not logged again. Memory
// is bounded: cooldowns are pruned once they expire.
package heal
