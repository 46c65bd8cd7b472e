// Command csiprobe is the lab's small CSI client: it connects to a plugin's
// unix socket and calls the Identity service (GetPluginInfo,
// GetPluginCapabilities, Probe) and the Node service (NodeGetInfo,
// NodeGetCapabilities), printing each answer. It exits non-zero when a
// call fails or Probe reports not ready, so a lab run can rely on it.
//
// Usage:
//
//	csiprobe -endpoint unix:///run/pathmend/csi.sock [-wait 30s] [-timeout 10s]
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
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "csiprobe:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	fl := flag.NewFlagSet("csiprobe", flag.ContinueOnError)
	endpoint := fl.String("endpoint", "unix:///run/pathmend/csi.sock", "CSI endpoint (unix socket)")
	wait := fl.Duration("wait", 30*time.Second, "how long to wait for the socket to appear")
	timeout := fl.Duration("timeout", 10*time.Second, "deadline of each call")
	if err := fl.Parse(args); err != nil {
		return err
	}
	sock, ok := strings.CutPrefix(*endpoint, "unix://")
	if !ok {
		return fmt.Errorf("endpoint %q: only unix:// endpoints are supported", *endpoint)
	}
	if err := waitForSocket(sock, *wait); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	node := csi.NewNodeClient(conn)
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), *timeout)
	}

	ctx, cancel := call()
	info, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("call GetPluginInfo: %w", err)
	}
	fmt.Fprintf(w, "GetPluginInfo:         name=%s vendor_version=%s\n", info.GetName(), info.GetVendorVersion())

	ctx, cancel = call()
	caps, err := id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("call GetPluginCapabilities: %w", err)
	}
	var names []string
	for _, c := range caps.GetCapabilities() {
		if s := c.GetService(); s != nil {
			names = append(names, s.GetType().String())
		}
		if v := c.GetVolumeExpansion(); v != nil {
			names = append(names, "VOLUME_EXPANSION_"+v.GetType().String())
		}
	}
	fmt.Fprintf(w, "GetPluginCapabilities: %s\n", orNone(names))

	ctx, cancel = call()
	probe, err := id.Probe(ctx, &csi.ProbeRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("call Probe: %w", err)
	}
	ready := probe.GetReady() == nil || probe.GetReady().GetValue()
	fmt.Fprintf(w, "Probe:                 ready=%t\n", ready)

	ctx, cancel = call()
	ni, err := node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("call NodeGetInfo: %w", err)
	}
	fmt.Fprintf(w, "NodeGetInfo:           node_id=%s max_volumes_per_node=%d topology=%v\n",
		ni.GetNodeId(), ni.GetMaxVolumesPerNode(), ni.GetAccessibleTopology().GetSegments())

	ctx, cancel = call()
	nc, err := node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("call NodeGetCapabilities: %w", err)
	}
	names = names[:0]
	for _, c := range nc.GetCapabilities() {
		names = append(names, c.GetRpc().GetType().String())
	}
	fmt.Fprintf(w, "NodeGetCapabilities:   %s\n", orNone(names))
	if !ready {
		return errors.New("plugin not ready (Probe)")
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

func waitForSocket(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		fi, err := os.Stat(path)
		if err == nil && fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no socket at %s after %s", path, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
