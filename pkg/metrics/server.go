package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// HealthCheck reports why the plugin is not healthy, or nil.
type HealthCheck func(ctx context.Context) error

const (
	// HealthTTL is how long /healthz answers with the result of its last
	// check before it runs the check again.
	HealthTTL = time.Second
	// checkTimeout bounds one run of the check.
	checkTimeout = 5 * time.Second
	// maxConns bounds the connections the listener serves at once:
	// Prometheus and kubelet's probes need a handful; a flood waits in the
	// kernel's accept queue instead of costing the plugin a goroutine each.
	maxConns = 32
)

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

// ServeListener is Serve on an open listener (tests use port 0). The
// check runs at most once per HealthTTL however many requests ask (see
// CachedCheck), and at most maxConns connections are served at once, so
// no rate of requests makes the plugin do more than a bounded amount of
// work.
func ServeListener(ctx context.Context, lis net.Listener, m *Metrics, check HealthCheck) error {
	return serveListener(ctx, lis, m, CachedCheck(check, HealthTTL, clock.RealClock{}))
}

// serveListener serves on lis with cached as /healthz's check, already
// wrapped by CachedCheck (tests wrap it on a fake clock).
func serveListener(ctx context.Context, lis net.Listener, m *Metrics, cached HealthCheck) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := cached(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    8 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(netutil.LimitListener(lis, maxConns)) }()
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

// CachedCheck returns check run at most once per ttl on clk, however many
// callers ask and however fast: a caller within ttl of the last result
// gets that result; a caller that finds a run in flight waits for it (or
// for its own context); only one run is ever in flight. A run has its own
// timeout and is not tied to the caller that started it, so a client that
// hangs up cannot fail the check for the others.
func CachedCheck(check HealthCheck, ttl time.Duration, clk clock.PassiveClock) HealthCheck {
	c := &cachedCheck{check: check, ttl: ttl, clk: clk}
	return c.run
}

type cachedCheck struct {
	check HealthCheck
	ttl   time.Duration
	clk   clock.PassiveClock

	mu       sync.Mutex
	valid    bool
	at       time.Time
	err      error
	inflight chan struct{} // closed when the run in flight ends
}

func (c *cachedCheck) run(ctx context.Context) error {
	c.mu.Lock()
	if c.valid && c.clk.Since(c.at) < c.ttl {
		err := c.err
		c.mu.Unlock()
		return err
	}
	ch := c.inflight
	if ch == nil {
		ch = make(chan struct{})
		c.inflight = ch
		go c.refresh(context.WithoutCancel(ctx), ch)
	}
	c.mu.Unlock()
	select {
	case <-ch:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("health check still running: %w", ctx.Err())
	}
}

// refresh runs the check once, bounded by checkTimeout, stores its result
// and closes done.
func (c *cachedCheck) refresh(ctx context.Context, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	err := c.check(ctx)
	cancel()
	c.mu.Lock()
	c.valid, c.at, c.err, c.inflight = true, c.clk.Now(), err, nil
	c.mu.Unlock()
	close(done)
}
