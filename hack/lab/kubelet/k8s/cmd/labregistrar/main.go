// Command labregistrar registers a CSI driver with kubelet through
// kubelet's plugin registration API, as node-driver-registrar does in
// pathmend's DaemonSet; the kubelet lab runs it beside `pathmend serve`
// because node-driver-registrar's module is not available to build here.
//
//	labregistrar -csi-address /var/lib/kubelet/plugins/csi.pathmend.io/csi.sock \
//	    [-kubelet-registration-path PATH] [-plugin-registration-path /var/lib/kubelet/plugins_registry]
//
// It waits until the driver answers GetPluginInfo on -csi-address (for its
// name), then serves pluginregistration.v1 Registration on
// <plugin-registration-path>/<name>-reg.sock: GetInfo names the driver,
// type CSIPlugin, the endpoint kubelet is to use
// (-kubelet-registration-path, the CSI socket by default) and CSI version
// 1.0.0. kubelet's plugin watcher finds the socket, calls GetInfo,
// validates and registers the driver (NodeGetInfo, CSINode) and reports
// back with NotifyRegistrationStatus. A refused registration ends the
// registrar with exit status 1, as it ends node-driver-registrar; so does
// a removed registration socket. SIGTERM/SIGINT remove the socket and end
// it with 0. One line per event goes to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("labregistrar: ")
	if err := run(os.Args[1:]); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("labregistrar", flag.ContinueOnError)
	csiAddress := fl.String("csi-address", "", "the driver's CSI socket (a path or unix:// URL; required)")
	kubeletPath := fl.String("kubelet-registration-path", "", "the CSI socket path kubelet is told to use (default: -csi-address)")
	regDir := fl.String("plugin-registration-path", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory")
	wait := fl.Duration("wait", 2*time.Minute, "how long to wait for the driver to answer GetPluginInfo")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *csiAddress == "" {
		return errors.New("-csi-address is required")
	}
	if *kubeletPath == "" {
		*kubeletPath = socketPath(*csiAddress)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	wctx, cancel := context.WithTimeout(ctx, *wait)
	name, err := driverName(wctx, *csiAddress)
	cancel()
	if err != nil {
		return err
	}
	log.Printf("driver %s answers on %s", name, *csiAddress)
	reg := &Registrar{Name: name, Endpoint: *kubeletPath, Socket: filepath.Join(*regDir, name+"-reg.sock")}
	err = reg.Serve(ctx)
	if errors.Is(err, context.Canceled) {
		log.Print("stopped")
		return nil
	}
	return fmt.Errorf("registration of %s: %w", name, err)
}
