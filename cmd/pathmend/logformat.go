package main

import (
	"io"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/internal/logsink"
	"github.com/pathmend/pathmend/pkg/scrub"
)

// setLogFormat routes every log line of the process — klog's, structured
// or not, and gRPC's own — to w through the process's scrubber
// (internal/logsink): "text" is klog's format, "json" the Kubernetes
// JSON schema the CSI sidecars and kubelet write with the same
// --logging-format=json, so one pipeline parses the whole pod. klog's -v
// and --vmodule still decide what is logged.
func setLogFormat(format string, w io.Writer) error {
	l, opts, err := logsink.New(format, w)
	if err != nil {
		return err
	}
	klog.SetLoggerWithOptions(l, opts...)
	// gRPC logs its own errors (a listener failing) to standard error:
	// through the same scrubber.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, scrub.Default.Writer(w)))
	return nil
}
