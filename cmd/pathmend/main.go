// Command pathmend is a Kubernetes CSI node plugin for NVMe-oF/TCP and iSCSI
// block volumes that keeps every path to every volume healthy.
//
// Usage:
//
//	pathmend serve [flags]     serve the CSI Identity and Node services
//	pathmend companion [flags] heal the paths of volumes another CSI driver attached
//	pathmend diagnose [flags]  report the node's paths and defects, read-only
//	pathmend version           print the version
//	pathmend help [COMMAND]    print the usage, or a command's help
//
// With no command it prints the usage and exits 2, touching nothing.
//
// The subcommand table is in cli.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func versionCommand() *command {
	return &command{
		name:        "version",
		summary:     "Print the version stamped at build time",
		synopsis:    []string{"version"},
		description: "Print pathmend's version and exit: the release tag it was built from (v0.1.0),\nor the release a development build leads to and its commit\n(v0.1.0-dev+0123456789ab).",
		run: func(c *command, args []string, stdout, stderr io.Writer) int {
			if code, done := c.parse(c.newFlagSet(), args, stdout, stderr); done {
				return code
			}
			fmt.Fprintln(stdout, buildVersion())
			return 0
		},
	}
}

func serveCommand() *command {
	return &command{
		name:     "serve",
		summary:  "Serve the CSI Identity and Node services and heal every path",
		synopsis: []string{"serve [flags]"},
		description: `Serve the CSI Identity and Node services on --endpoint for kubelet: attach
NVMe-oF/TCP and iSCSI volumes, stage and publish them. Unless --heal=off, a
monitor reads sysfs every --monitor-interval and heals broken paths with the
repair policy (--heal=observe decides and logs every verdict, touching
nothing). SIGTERM or SIGINT stops it after in-flight RPCs finish (at most
--shutdown-timeout).`,
		groups: []flagGroup{
			{"CSI flags", []string{"endpoint", "node-id", "driver-name", "max-volumes-per-node", "topology-key", "topology-value", "default-fs-type", "shutdown-timeout"}},
			{"Node state flags", []string{"sys-root", "dev-root", "proc-root", "state-dir", "kubelet-root", "intent-timeout", "hostnqn-file", "hostid-file"}},
			{"Filesystem flags", []string{"kernel-call-timeout", "xfs-repair"}},
			{"Healing flags", []string{"heal", "monitor-interval", "kernel-events", "heal-grace", "heal-cooldown", "heal-max-scope", "connect-timeout", "reconnect-backoff-max", "attach-timeout"}},
			{"Companion flags", []string{"heal-foreign", "nvme-reconnect", "nvme-repairs", "forget-after"}},
			{"iSCSI flags", []string{"heal-iscsi-scope", "iscsi-stuck-threshold", "iscsid-restart-cooldown", "iscsid-restart-command", "host-command-prefix", "host-mountinfo", "no-multipathd"}},
			{"Metrics flags", []string{"metrics-address"}},
			{"Logging flags", []string{"logging-format", "v", "vmodule"}},
		},
		exitCodes: []exitCode{
			{0, "stopped by SIGTERM or SIGINT after in-flight RPCs finished"},
			{1, "a flag value is invalid, or serving failed (socket, state dir, metrics listener)"},
			{2, "bad usage: an unknown flag or a stray argument"},
		},
		run: runServe,
	}
}

// klogKeptFlags are klog's flags serve lists, with pathmend's usage text;
// klog's others (-logtostderr, -log_dir, …) are still accepted, for old
// manifests, but hidden.
var klogKeptFlags = map[string]string{
	"v":       "log verbosity `N`: 0 heal verdicts and errors, 2 attach and detach, 4 RPC entry and diagnosis, 5 sysfs reads and sanitized requests",
	"vmodule": "verbosity per source file, `PATTERN=N,...` (e.g. monitor*=5)",
}

func runServe(c *command, args []string, stdout, stderr io.Writer) int {
	fs := c.newFlagSet()
	cfg := defaultServeConfig()
	cfg.bindFlags(fs)
	logFormat := bindLogFlags(fs)
	if code, done := c.parse(fs, args, stdout, stderr); done {
		return code
	}
	if code, done := startLogging(c, fs, *logFormat, stderr); done {
		return code
	}
	defer klog.Flush()
	id, err := resolveNodeID(cfg.nodeID, os.Hostname)
	if err != nil {
		klog.ErrorS(err, "pathmend serve failed")
		return 1
	}
	cfg.nodeID = id

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, cfg); err != nil {
		klog.ErrorS(err, "pathmend serve failed")
		return 1
	}
	return 0
}

// bindLogFlags adds klog's flags (the ones not in klogKeptFlags hidden)
// and --logging-format to fs.
func bindLogFlags(fs *flag.FlagSet) (logFormat *string) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	kfs.VisitAll(func(f *flag.Flag) {
		usage, kept := klogKeptFlags[f.Name]
		if !kept {
			usage = f.Usage
		}
		fs.Var(f.Value, f.Name, usage)
		if !kept {
			hide(fs, f.Name)
		}
	})
	logFormat = fs.String("logging-format", "text", "log format: text (klog's) or json (the Kubernetes JSON schema, one object per line: ts, caller, msg, v, key/values, err)")
	fs.StringVar(logFormat, "log-format", "text", "deprecated: use --logging-format")
	hide(fs, "log-format")
	return logFormat
}

// startLogging applies --logging-format after the flags were parsed;
// done is set (with the exit status) when the format is invalid.
func startLogging(c *command, fs *flag.FlagSet, format string, stderr io.Writer) (code int, done bool) {
	if err := setLogFormat(format, stderr); err != nil {
		fmt.Fprintf(stderr, "pathmend %s: %v\n", c.name, err)
		return 2, true
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "log-format" {
			klog.InfoS("Flag --log-format is deprecated and will be removed in a later release; use --logging-format")
		}
	})
	return 0, false
}

// resolveNodeID is --node-id, or the host name of the node pathmend runs
// on when it is empty (read at run time, never at build time).
func resolveNodeID(flagValue string, hostname func() (string, error)) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	h, err := hostname()
	if err != nil {
		return "", fmt.Errorf("--node-id is empty and the host name is unreadable: %w", err)
	}
	if h == "" {
		return "", fmt.Errorf("--node-id is empty and the host name is empty")
	}
	return h, nil
}
