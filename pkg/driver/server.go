package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// ParseEndpoint returns the socket path of a unix endpoint:
// "unix:///csi/csi.sock" and "unix:/csi/csi.sock" both name /csi/csi.sock.
// A node plugin talks to kubelet over a unix socket only.
func ParseEndpoint(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "unix:")
	if !ok {
		return "", fmt.Errorf("endpoint %q: only unix:// endpoints are supported", endpoint)
	}
	rest = strings.TrimPrefix(rest, "//")
	if rest == "" || !filepath.IsAbs(rest) {
		return "", fmt.Errorf("endpoint %q: want an absolute socket path, e.g. unix:///csi/csi.sock", endpoint)
	}
	return filepath.Clean(rest), nil
}

// listen opens the socket. A socket file left by a crashed run is removed;
// a socket that still answers belongs to a live plugin and is an error.
func listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			conn.Close()
			return nil, fmt.Errorf("%s is served by another running process", path)
		}
		klog.InfoS("Removing stale socket", "path", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	return net.Listen("unix", path)
}

// ServerOptions are the options every gRPC server of d is built with: the
// logging interceptor, which also maps errors to statuses, and inside it
// the door, which refuses a request over the CSI size limits before any
// handler runs. The receive limit stays gRPC's 4 MiB, so that a request
// over a CSI limit is refused by the door, naming its field, rather than
// by the transport.
func (d *Driver) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(d.logInterceptor, d.doorInterceptor),
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
	}
}

// maxRecvMsgSize is gRPC's default receive limit, stated: the largest
// request the CSI limits admit is about 30 KiB.
const maxRecvMsgSize = 4 << 20

// NewGRPCServer returns a gRPC server with the driver's Identity and Node
// services registered.
func (d *Driver) NewGRPCServer() *grpc.Server {
	s := grpc.NewServer(d.ServerOptions()...)
	csi.RegisterIdentityServer(s, d)
	csi.RegisterNodeServer(s, d)
	return s
}

// Run serves the driver on endpoint until ctx ends. Then it stops
// accepting, lets in-flight RPCs finish for at most stopTimeout, and
// removes the socket.
func (d *Driver) Run(ctx context.Context, endpoint string, stopTimeout time.Duration) error {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return err
	}
	lis, err := listen(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	srv := d.NewGRPCServer()
	klog.InfoS("Serving CSI", "endpoint", endpoint, "driver", d.cfg.DriverName, "version", d.cfg.Version, "nodeID", d.cfg.NodeID, "heal", d.cfg.HealMode)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve %s: %w", endpoint, err)
	case <-ctx.Done():
	}
	klog.InfoS("Stopping: waiting for in-flight RPCs", "timeout", stopTimeout)
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		klog.InfoS("In-flight RPCs did not finish in time; stopping hard", "timeout", stopTimeout)
		srv.Stop()
	}
	return nil
}
