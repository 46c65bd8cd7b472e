package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
)

// healthCheck is /healthz: the CSI server answers Probe over its socket,
// and the loop finished a tick within maxAge, as the node model says
// (unless healing is off).
// It keeps one client connection to the socket for every check (closed by
// the returned func), and the metrics server runs it at most once a
// second (metrics.CachedCheck), so a flood of requests costs the plugin
// one Probe per second: a round trip on an open connection and two system
// calls on the state dir, no file written.
func healthCheck(endpoint string, m *model.Model, mode heal.Mode, maxAge time.Duration) (metrics.HealthCheck, func(), error) {
	path, err := driver.ParseEndpoint(endpoint)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	identity := csi.NewIdentityClient(conn)
	ticked := tickCheck(m, mode, maxAge)
	check := func(ctx context.Context) error {
		resp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			return fmt.Errorf("CSI server does not answer: %w", err)
		}
		if !resp.GetReady().GetValue() {
			return errors.New("CSI server is not ready")
		}
		return ticked(ctx)
	}
	return check, func() { conn.Close() }, nil
}
