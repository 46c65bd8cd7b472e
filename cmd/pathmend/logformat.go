package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/pathmend/pathmend/internal/logjson"
)

// setLogFormat routes every log line of the process — klog's, structured
// or not, and gRPC's own — to w, which run has made scrub every secret
// the process has seen (package scrub). "text" is klog's format (klog's
// text logger, writing klog's header and key/value text); "json" is the
// Kubernetes JSON schema the CSI sidecars and kubelet write with the same
// --logging-format=json (internal/logjson), so one pipeline parses the
// whole pod. klog's -v and --vmodule still decide what is logged: klog
// checks them before it hands a line to the logger, which passes every
// line it is handed.
func setLogFormat(format string, w io.Writer) error {
	switch format {
	case "text":
		l := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w), textlogger.Verbosity(math.MaxInt32)))
		opts := []klog.LoggerOption{}
		if kb, ok := l.GetSink().(textlogger.KlogBufferWriter); ok {
			// printf-style calls keep klog's own text.
			opts = append(opts, klog.WriteKlogBuffer(kb.WriteKlogBuffer))
		}
		klog.SetLoggerWithOptions(l, opts...)
	case "json":
		klog.SetLogger(logjson.New(w, time.Now))
	default:
		return fmt.Errorf("--logging-format %q: want text or json", format)
	}
	// gRPC logs its own errors (a listener failing) to standard error:
	// through the same writer.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, w))
	return nil
}
