package driver_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
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
	for _, s := range sanitySkips {
		suiteCfg.SkipStrings = append(suiteCfg.SkipStrings, s.pattern)
	}
	// Plain text: the output goes to logs and CI pages, not a terminal.
	reporterCfg.NoColor = true
	ginkgo.ReportAfterSuite("pathmend csi-sanity summary", func(r ginkgo.Report) {
		for _, line := range sanitySummary(r) {
			t.Log(line)
		}
		if n := r.SpecReports.CountWithState(types.SpecStatePassed); n == 0 {
			t.Error("csi-sanity: no spec passed: the suite did not really run")
		}
	})
	ginkgo.RunSpecs(t, "pathmend csi-sanity", suiteCfg, reporterCfg)
	sc.Finalize()
}

// sanitySkips are the csi-sanity specs TestSanity skips, and why.
var sanitySkips = []struct{ pattern, why string }{
	{`\[Controller Server\]`, "controller specs: pathmend is a node plugin; the loop controller here only provisions the node specs' volumes"},
	{`\[GroupController`, "group snapshot specs: a controller service pathmend does not have"},
}

// sanitySummary is what `make sanity` prints under the "Ran N of M
// Specs" line: the counts and, for every skipped or pending spec, why.
func sanitySummary(r ginkgo.Report) []string {
	specs := r.SpecReports.WithLeafNodeType(types.NodeTypeIt)
	lines := []string{fmt.Sprintf("csi-sanity summary: %d passed, %d failed, %d skipped, %d pending of %d specs",
		specs.CountWithState(types.SpecStatePassed), specs.CountWithState(types.SpecStateFailureStates),
		specs.CountWithState(types.SpecStateSkipped), specs.CountWithState(types.SpecStatePending), len(specs))}
	counts := make([]int, len(sanitySkips))
	var other []string
	for _, s := range specs {
		switch s.State {
		case types.SpecStateSkipped:
			matched := false
			for i, sk := range sanitySkips {
				if regexp.MustCompile(sk.pattern).MatchString(s.FullText()) {
					counts[i]++
					matched = true
					break
				}
			}
			if !matched {
				why := s.Failure.Message
				if why == "" {
					why = "skipped"
				}
				other = append(other, fmt.Sprintf("skipped %q: %s", s.FullText(), why))
			}
		case types.SpecStatePending:
			other = append(other, fmt.Sprintf("pending %q: marked pending in csi-test itself, run by no driver", s.FullText()))
		}
	}
	for i, sk := range sanitySkips {
		if counts[i] > 0 {
			lines = append(lines, fmt.Sprintf("csi-sanity skipped %d specs matching %s: %s", counts[i], sk.pattern, sk.why))
		}
	}
	for _, o := range other {
		lines = append(lines, "csi-sanity "+o)
	}
	return lines
}
