package heal

// Class is why a verdict is what it is, as a closed set: the `reason`
// label of pathmend_repairs_total and the alerts built on it. An
// Outcome's Reason is the same why in words, with the numbers and names
// of this instance; Class is its bounded form, never derived from the
// text. Every Class constant is listed in classes with its meaning, and
// docs/metrics.md and docs/operations.md list every one of them (the
// deploy package's tests read the constants from this package's source).
type Class string

// The NVMe policy's classes, shared with the iSCSI session heal where the
// rule is the same.
const (
	// ClassScopeCap: refused, the teardown is wider than --heal-max-scope.
	ClassScopeCap Class = "scope_cap"
	// ClassCoTenants: refused, the teardown would leave another
	// namespace with no accessible path.
	ClassCoTenants Class = "co_tenants"
	// ClassCooldown: deferred, the same key was repaired (or kicked)
	// within --heal-cooldown.
	ClassCooldown Class = "cooldown"
	// ClassGrace: deferred, a controller to tear down is younger than
	// --heal-grace.
	ClassGrace Class = "grace"
	// ClassObserveMode: observed, --heal=observe; the repair would run.
	ClassObserveMode Class = "observe_mode"
	// ClassTornDown: repaired, the teardown ran.
	ClassTornDown Class = "torn_down"
	// ClassTeardownFailed: failed, the teardown returned an error.
	ClassTeardownFailed Class = "teardown_failed"
	// ClassFirstStepCured: repaired, the non-destructive first step (the
	// rescan of a missing namespace) brought the defect to an end;
	// nothing was torn down.
	ClassFirstStepCured Class = "first_step_cured"
	// ClassUnreadableRecord: refused, a staged-volume record that may be
	// a volume of the target cannot be read: nothing of the target is
	// torn down until it is readable or removed (docs/state.md).
	ClassUnreadableRecord Class = "unreadable_record"
)

// The iSCSI session heal's own classes (pkg/iscsi).
const (
	// ClassOutOfScope: refused, no staged volume uses the session's target
	// and --heal-iscsi-scope is staged.
	ClassOutOfScope Class = "out_of_scope"
	// ClassLoginRejected: refused, the target rejected pathmend's own
	// login (credentials, ACL): kicking again cannot help.
	ClassLoginRejected Class = "login_rejected"
	// ClassPortalUnreachable: refused, the portal does not answer; iscsid
	// retries by itself.
	ClassPortalUnreachable Class = "portal_unreachable"
	// ClassAwaitingPortal: deferred, a node record has no session and its
	// portal does not answer; pathmend logs in once it answers (iscsid
	// has no session to retry).
	ClassAwaitingPortal Class = "awaiting_portal"
	// ClassReachability: deferred, the portal has not been reachable
	// without interruption for --iscsi-stuck-threshold yet.
	ClassReachability Class = "reachability"
	// ClassRestartCooldown: deferred, iscsid was restarted within
	// --iscsid-restart-cooldown.
	ClassRestartCooldown Class = "restart_cooldown"
	// ClassNarrowestFirst: deferred, another kick ran this tick; the
	// iscsid restart is decided again on fresh state.
	ClassNarrowestFirst Class = "narrowest_first"
	// ClassInFlight: deferred, a login or logout is running; iscsid is
	// not restarted under it.
	ClassInFlight Class = "in_flight"
	// ClassLoggedIn: repaired, the kicked session is LOGGED_IN again.
	ClassLoggedIn Class = "logged_in"
	// ClassNotLoggedIn: failed, the kick ran but the session was not
	// LOGGED_IN within the verify window.
	ClassNotLoggedIn Class = "not_logged_in"
	// ClassKickFailed: failed, the login, logout or restart command
	// failed.
	ClassKickFailed Class = "kick_failed"
	// ClassTargetBusy: deferred, an attach, a detach or another job holds
	// the target's lease; the kick is decided again next tick.
	ClassTargetBusy Class = "target_busy"
	// ClassNotWanted: refused, under the target's lease no staged volume
	// wants the session any more (its volume is detaching or unstaged).
	ClassNotWanted Class = "not_wanted"
)

// Companion mode's own classes (pkg/companion), shared by its NVMe and
// iSCSI heals.
const (
	// ClassActionDisabled: observed, the repair or kick would run but its
	// action kind is not enabled (companion mode's per-action flags).
	ClassActionDisabled Class = "action_disabled"
	// ClassOwnedByNodePlugin: refused, a staged-volume record of the node
	// plugin names the target: its kernel objects are the plugin's.
	ClassOwnedByNodePlugin Class = "owned_by_node_plugin"
)

// classes is every Class with its meaning in one line (the order the docs
// list them in).
var classes = []struct {
	Class   Class
	Meaning string
}{
	{ClassScopeCap, "refused: the teardown is wider than --heal-max-scope"},
	{ClassCoTenants, "refused: the teardown would leave another namespace with no accessible path"},
	{ClassCooldown, "deferred: the key was repaired or kicked within --heal-cooldown"},
	{ClassGrace, "deferred: a controller to tear down is younger than --heal-grace"},
	{ClassObserveMode, "observed: --heal=observe; the repair would run"},
	{ClassTornDown, "repaired: the teardown ran"},
	{ClassTeardownFailed, "failed: the teardown returned an error"},
	{ClassFirstStepCured, "repaired: the rescan of a missing namespace brought it back; nothing torn down"},
	{ClassUnreadableRecord, "refused: a staged-volume record that may be the target's cannot be read; nothing of the target is torn down"},
	{ClassOutOfScope, "refused: no staged volume uses the session's target (--heal-iscsi-scope=staged)"},
	{ClassLoginRejected, "refused: the target rejected pathmend's own login; kicking again cannot help"},
	{ClassPortalUnreachable, "refused: the portal does not answer; iscsid retries by itself"},
	{ClassAwaitingPortal, "deferred: no session, and the portal does not answer; pathmend logs in once it answers"},
	{ClassReachability, "deferred: the portal has not been reachable without interruption for --iscsi-stuck-threshold"},
	{ClassRestartCooldown, "deferred: iscsid was restarted within --iscsid-restart-cooldown"},
	{ClassNarrowestFirst, "deferred: another kick ran this tick; the restart is decided again next tick"},
	{ClassInFlight, "deferred: a login or logout is running; iscsid is not restarted under it"},
	{ClassLoggedIn, "repaired: the kicked session is LOGGED_IN again"},
	{ClassNotLoggedIn, "failed: the kicked session was not LOGGED_IN within the verify window"},
	{ClassKickFailed, "failed: the login, logout or iscsid restart command failed"},
	{ClassTargetBusy, "deferred: an attach, a detach or another job holds the target; decided again next tick"},
	{ClassNotWanted, "refused: no staged volume wants the session any more (detaching or unstaged)"},
	{ClassActionDisabled, "observed: companion mode; the action would run but its kind is not enabled"},
	{ClassOwnedByNodePlugin, "refused: companion mode; a staged-volume record names the target, which is the node plugin's"},
}

// Classes returns every Class, in documentation order.
func Classes() []Class {
	out := make([]Class, len(classes))
	for i, c := range classes {
		out[i] = c.Class
	}
	return out
}

// Meaning is the one-line meaning of c, or "" for a value that is not a
// Class constant.
func (c Class) Meaning() string {
	for _, k := range classes {
		if k.Class == c {
			return k.Meaning
		}
	}
	return ""
}
