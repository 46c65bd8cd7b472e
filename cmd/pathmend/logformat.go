package main

import (
	"fmt"
	"io"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/internal/logjson"
)

// setLogFormat switches klog's output. "text" keeps klog's own format;
// "json" routes every klog call, structured or not, through logjson: the
// Kubernetes JSON schema the CSI sidecars and kubelet write with the same
// --logging-format=json, so one pipeline parses the whole pod. klog's -v
// and --vmodule still decide what is logged.
func setLogFormat(format string, w io.Writer) error {
	switch format {
	case "text":
		return nil
	case "json":
		klog.SetLogger(logjson.New(w, time.Now))
		return nil
	}
	return fmt.Errorf("--logging-format %q: want text or json", format)
}
