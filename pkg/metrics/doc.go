// Package metrics owns pathmend's Prometheus collectors and the HTTP
// listener that serves them at /metrics, with the health check at
// /healthz.
//
// It knows no transport and no CSI: the monitor and the wiring in
// cmd/pathmend report into Metrics, and the health check is a function
// the wiring builds.
//
// Invariants: label values come from closed sets or from staged volumes
// (whose series are deleted when they are unstaged), so cardinality is
// bounded; /healthz runs its check at most once per HealthTTL whatever the
// request rate (CachedCheck), and the listener serves a bounded number of
// connections at once.
package metrics
