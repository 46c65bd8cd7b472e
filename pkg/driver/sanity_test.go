package driver_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"

	"github.com/pathmend/pathmend/internal/looptest"
	"github.com/pathmend/pathmend/pkg/driver"
)

// sanityIdentity is the real Identity server plus CONTROLLER_SERVICE: in
// this test the loop controller below is part of the deployment, and
// csi-sanity runs its full node lifecycle specs ("should work", "should be
// idempotent") only when the plugin under test advertises a controller.
// pathmend itself never does; TestIdentity pins that.
type sanityIdentity struct {
	*driver.Driver
}

func (s sanityIdentity) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp, err := s.Driver.GetPluginCapabilities(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	})
	return resp, nil
}

// TestSanity runs csi-sanity's Identity and Node specs against the real
// NodeServer over a real unix socket, with real loop devices, mkfs, mounts
// and bind mounts. It needs root; `make sanity` runs it.
func TestSanity(t *testing.T) {
	if os.Getenv("PATHMEND_SANITY") == "" {
		t.Skip("csi-sanity runs with PATHMEND_SANITY=1 (make sanity): it needs root, loop devices and mounts")
	}
	requireMounts(t)

	dir := t.TempDir()
	env := newTestEnv(t, dir, "xfs") // xfs: grows online without CAP_SYS_RESOURCE
	ctrl := looptest.NewController(env.backingDir, env.attacher)

	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(env.driver.ServerOptions()...)
	csi.RegisterIdentityServer(srv, sanityIdentity{env.driver})
	csi.RegisterNodeServer(srv, env.driver)
	csi.RegisterControllerServer(srv, ctrl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	cfg := sanity.NewTestConfig()
	cfg.Address = "unix:" + sock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 512 << 20
	cfg.TestVolumeExpandSize = 1 << 30
	cfg.IdempotentCount = 3

	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteCfg, reporterCfg := ginkgo.GinkgoConfiguration()
	// pathmend is a node plugin: the controller specs test the loop
	// controller, not pathmend.
	suiteCfg.SkipStrings = append(suiteCfg.SkipStrings, `\[Controller Server\]`, `\[GroupController`)
	ginkgo.RunSpecs(t, "pathmend csi-sanity", suiteCfg, reporterCfg)
	sc.Finalize()
}
