package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// shortDir is a temporary directory with a path short enough for unix
// sockets (108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type identity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (i identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: "test"}, nil
}

func serveIdentity(t *testing.T, sock, name string) {
	t.Helper()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{name: name})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
}

// kubelet dials the registration socket the way kubelet's plugin watcher
// does.
func kubelet(t *testing.T, sock string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
}

func TestDriverName_AsksTheDriver(t *testing.T) {
	sock := filepath.Join(shortDir(t), "csi.sock")
	serveIdentity(t, sock, "csi.pathmend.io")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := driverName(ctx, "unix://"+sock)
	if err != nil || got != "csi.pathmend.io" {
		t.Errorf("driverName = %q, %v; want csi.pathmend.io", got, err)
	}
}

func TestDriverName_GivesUpWhenNobodyAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := driverName(ctx, filepath.Join(shortDir(t), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "did not answer GetPluginInfo") {
		t.Errorf("driverName with no driver = %v, want an error saying it did not answer", err)
	}
}

func TestServe_AnswersKubeletAndEndsOnARefusal(t *testing.T) {
	dir := shortDir(t)
	reg := &Registrar{Name: "csi.pathmend.io", Endpoint: "/var/lib/kubelet/plugins/csi.pathmend.io/csi.sock", Socket: filepath.Join(dir, "csi.pathmend.io-reg.sock")}
	// A stale socket from an earlier run is replaced.
	if err := os.WriteFile(reg.Socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- reg.Serve(ctx) }()
	time.Sleep(50 * time.Millisecond)
	waitFor(t, reg.Socket)
	k := kubelet(t, reg.Socket)

	info, err := k.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.pathmend.io", Endpoint: reg.Endpoint, SupportedVersions: []string{"1.0.0"}}
	if diff := cmp.Diff(want, info, protocmp.Transform()); diff != "" {
		t.Errorf("GetInfo (-want +got):\n%s", diff)
	}
	if _, err := k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve ended after a successful registration: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version 9 not supported"}); err != nil {
		t.Fatal(err)
	}
	err = <-served
	if err == nil || !strings.Contains(err.Error(), "version 9 not supported") {
		t.Errorf("Serve after a refusal = %v, want kubelet's error", err)
	}
	if _, err := os.Stat(reg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registration socket after Serve: %v, want it removed", err)
	}
}

func TestServe_EndsWhenTheSocketIsRemovedOrTheContextEnds(t *testing.T) {
	dir := shortDir(t)
	reg := &Registrar{Name: "d", Endpoint: "/x", Socket: filepath.Join(dir, "d-reg.sock")}
	served := make(chan error, 1)
	go func() { served <- reg.Serve(context.Background()) }()
	waitFor(t, reg.Socket)
	os.Remove(reg.Socket)
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "registration socket") {
			t.Errorf("Serve after the socket went = %v, want an error naming it", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve went on without its socket")
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { served <- reg.Serve(ctx) }()
	waitFor(t, reg.Socket)
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve after cancel = %v, want context.Canceled", err)
	}
	if _, err := os.Stat(reg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registration socket after cancel: %v, want it removed", err)
	}
}
