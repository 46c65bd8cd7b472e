// Package heal is pathmend's transport-neutral repair policy.
//
// It owns the decision of whether a diagnosed defect may be repaired now:
// the heal mode (repair, observe, off), narrowest scope first, the co-tenant
// gate, cooldowns and the connect grace. It knows no transport: NVMe-oF and
// iSCSI diagnosis produce values this package decides on, and mechanism
// (tearing down a controller, logging out a session) lives with the
// transport.
//
// Today the package holds the heal mode parsed from --heal; the policy
// arrives with the NVMe attach and repair work.
package heal
