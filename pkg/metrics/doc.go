// Package metrics owns pathmend's Prometheus collectors and the HTTP
// listener that serves them at /metrics, with the health check at
// /healthz.
//
// It knows no transport and no CSI: the loop (pkg/monitor) sets it from
// what it writes into the node model each tick — paths per volume,
// staged devices replaced, defects, verdicts, the tick's duration — and
// the health check is a function the wiring builds on the model (the end
// of the last tick) and the CSI socket.
//
// Invariants: label values come from closed sets or from staged volumes
// (whose series are deleted when they are unstaged), so cardinality is
// bounded; /healthz runs its check at most once per HealthTTL whatever the
// request rate (CachedCheck), and the listener serves a bounded number of
// connections at once.
package metrics
