// Command csistage is the lab's CSI client for volumes: it stages,
// unstages and asks the health of one volume over a plugin's unix socket,
// the calls kubelet makes, so a lab walk-through can attach a volume
// through pathmend without a cluster. csiprobe covers the Identity service.
//
// Usage:
//
//	csistage -endpoint unix:///run/pathmend/csi.sock stage -volume-id ID -staging DIR -context KEY=VALUE,... [-fs ext4]
//	csistage -endpoint unix:///run/pathmend/csi.sock health -volume-id ID
//	csistage -endpoint unix:///run/pathmend/csi.sock unstage -volume-id ID -staging DIR
//
// stage creates DIR if needed and asks for a single-node-writer filesystem
// volume. health prints HEALTHY, or each entry as "STATUS reason: message".
// Every call fails with a non-zero exit and the gRPC status on stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "csistage:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	fl := flag.NewFlagSet("csistage", flag.ContinueOnError)
	endpoint := fl.String("endpoint", "unix:///run/pathmend/csi.sock", "CSI endpoint (unix socket)")
	timeout := fl.Duration("timeout", 90*time.Second, "deadline of the call")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() == 0 {
		return errors.New("want a command: stage, unstage or health")
	}
	cmd, rest := fl.Arg(0), fl.Args()[1:]
	sub := flag.NewFlagSet("csistage "+cmd, flag.ContinueOnError)
	id := sub.String("volume-id", "", "volume ID")
	staging := sub.String("staging", "", "staging target path")
	vctx := sub.String("context", "", "volume context, KEY=VALUE pairs separated by commas (a value may not contain a comma: list endpoints with ';')")
	fsType := sub.String("fs", "ext4", "filesystem type")
	if err := sub.Parse(rest); err != nil {
		return err
	}
	if *id == "" {
		return errors.New("-volume-id is required")
	}
	sock, ok := strings.CutPrefix(*endpoint, "unix://")
	if !ok {
		return fmt.Errorf("endpoint %q: only unix:// endpoints are supported", *endpoint)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch cmd {
	case "stage":
		if *staging == "" {
			return errors.New("-staging is required")
		}
		c, err := parseContext(*vctx)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(*staging, 0o750); err != nil {
			return err
		}
		start := time.Now()
		_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: *id, StagingTargetPath: *staging, VolumeContext: c,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: *fsType}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
		})
		if err != nil {
			return statusErr("NodeStageVolume", err)
		}
		fmt.Fprintf(w, "NodeStageVolume %s: OK in %s, mounted at %s\n", *id, time.Since(start).Round(time.Millisecond), *staging)
	case "unstage":
		if *staging == "" {
			return errors.New("-staging is required")
		}
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: *id, StagingTargetPath: *staging}); err != nil {
			return statusErr("NodeUnstageVolume", err)
		}
		fmt.Fprintf(w, "NodeUnstageVolume %s: OK\n", *id)
	case "health":
		resp, err := node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: *id})
		if err != nil {
			return statusErr("NodeGetVolumeHealth", err)
		}
		fmt.Fprintf(w, "NodeGetVolumeHealth %s: %s\n", *id, healthText(resp.GetVolumeHealth().GetHealthStatuses()))
	default:
		return fmt.Errorf("unknown command %q: want stage, unstage or health", cmd)
	}
	return nil
}

// parseContext reads "k=v,k=v"; in a value, ';' stands for ',' so that
// endpoint lists fit.
func parseContext(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("-context is required")
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-context: %q is not KEY=VALUE", kv)
		}
		out[strings.TrimSpace(k)] = strings.ReplaceAll(strings.TrimSpace(v), ";", ",")
	}
	return out, nil
}

func healthText(hs []*csi.VolumeHealth_VolumeHealthEntry) string {
	if len(hs) == 0 {
		return "HEALTHY"
	}
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		parts = append(parts, fmt.Sprintf("%s %s: %s", h.GetStatus(), h.GetReason(), h.GetMessage()))
	}
	return strings.Join(parts, "; ")
}

func statusErr(call string, err error) error {
	if s, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s: %s", call, s.Code(), s.Message())
	}
	return fmt.Errorf("%s: %w", call, err)
}
