package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// HealthCheck reports why the plugin is not healthy, or nil.
type HealthCheck func(ctx context.Context) error

// Serve listens on addr and serves /metrics and /healthz until ctx ends.
// /healthz answers 200 "ok" when check passes, 503 with the reason
// otherwise — the livenessprobe convention.
func Serve(ctx context.Context, addr string, m *Metrics, check HealthCheck) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener %s: %w", addr, err)
	}
	return ServeListener(ctx, lis, m, check)
}

// ServeListener is Serve on an open listener (tests use port 0).
func ServeListener(ctx context.Context, lis net.Listener, m *Metrics, check HealthCheck) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		cctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := check(cctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	klog.InfoS("Serving metrics and health", "address", lis.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
