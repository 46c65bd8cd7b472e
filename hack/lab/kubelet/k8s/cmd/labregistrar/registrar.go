package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registrar serves kubelet's plugin registration API for one CSI driver.
type Registrar struct {
	registerapi.UnimplementedRegistrationServer
	// Name is the driver's name (its GetPluginInfo answer).
	Name string
	// Endpoint is the CSI socket kubelet is to dial.
	Endpoint string
	// Socket is where the registration socket is created.
	Socket string

	// status receives kubelet's NotifyRegistrationStatus calls.
	status chan *registerapi.RegistrationStatus
}

// supportedVersions is what kubelet checks against the CSI versions it
// speaks (node-driver-registrar answers the same).
var supportedVersions = []string{"1.0.0"}

// GetInfo answers kubelet's first call on the registration socket.
func (r *Registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("kubelet asked for the plugin info: %s at %s", r.Name, r.Endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.Name,
		Endpoint:          r.Endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

// NotifyRegistrationStatus receives kubelet's verdict on the registration.
func (r *Registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.status <- s
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Serve creates the registration socket (replacing a stale one) and serves
// until ctx ends (ctx's error), kubelet refuses the registration or the
// socket is removed (an error saying so). The socket is removed on return.
func (r *Registrar) Serve(ctx context.Context) error {
	r.status = make(chan *registerapi.RegistrationStatus, 4)
	if err := os.Remove(r.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", r.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(r.Socket)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	// GracefulStop: kubelet gets the answer to a refusal before the end.
	defer srv.GracefulStop()
	log.Printf("serving the registration socket %s", r.Socket)

	// kubelet's plugin watcher forgets a plugin whose socket goes away;
	// so does the registrar (node-driver-registrar's health check).
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("registration server: %w", err)
		case s := <-r.status:
			if !s.GetPluginRegistered() {
				return fmt.Errorf("kubelet refused the registration: %s", s.GetError())
			}
			log.Printf("kubelet registered %s", r.Name)
		case <-tick.C:
			if _, err := os.Stat(r.Socket); err != nil {
				return fmt.Errorf("registration socket: %w", err)
			}
		}
	}
}

// socketPath turns a unix:// URL into a path; a path stays as it is.
func socketPath(addr string) string {
	return strings.TrimPrefix(addr, "unix://")
}

// driverName dials the CSI socket and asks GetPluginInfo until it answers
// or ctx ends; a driver that answers with an empty name is an error.
func driverName(ctx context.Context, addr string) (string, error) {
	conn, err := grpc.NewClient("unix://"+socketPath(addr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			if info.GetName() == "" {
				return "", fmt.Errorf("%s: GetPluginInfo answered no name", addr)
			}
			return info.GetName(), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not answer GetPluginInfo: %w", addr, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
