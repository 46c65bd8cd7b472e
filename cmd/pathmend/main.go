// Command pathmend is a Kubernetes CSI node plugin for NVMe-oF/TCP and iSCSI
// block volumes that keeps every path to every volume healthy.
//
// Usage:
//
//	pathmend [serve] [flags]   serve the CSI Identity and Node services (default)
//	pathmend version           print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

// version is stamped at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return runServe(args, stderr)
	case "diagnose":
		return runDiagnose(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case "help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "pathmend: unknown command %q\n", cmd)
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  pathmend [serve] [flags]   serve the CSI Identity and Node services (default)
  pathmend version           print the version
  pathmend diagnose [--sys-root DIR] [--state-dir DIR] [--json]   report NVMe and iSCSI paths and defects (exit 0 healthy, 1 defects, 2 error)
  pathmend serve -h          list the serve flags
`)
}

func runServe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := defaultServeConfig()
	cfg.bindFlags(fs)
	klog.InitFlags(fs)
	logFormat := fs.String("log-format", "text", "log format: text (klog) or json (one JSON object per line)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pathmend serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := setLogFormat(*logFormat, stderr); err != nil {
		fmt.Fprintln(stderr, "pathmend serve:", err)
		return 2
	}
	defer klog.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, cfg); err != nil {
		klog.ErrorS(err, "pathmend serve failed")
		return 1
	}
	return 0
}
