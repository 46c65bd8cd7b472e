package main

import (
	"fmt"
	"io"
	"sync"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// setLogFormat switches klog's output. "text" keeps klog's own format;
// "json" routes every klog call, structured or not, through a funcr JSON
// sink: one JSON object per line with ts, level, msg, caller and the
// structured keys, for log pipelines. funcr ships with logr, which klog
// already depends on, so JSON costs no new dependency. klog's -v still
// decides what is logged; the sink itself drops nothing.
func setLogFormat(format string, w io.Writer) error {
	switch format {
	case "text":
		return nil
	case "json":
		var mu sync.Mutex
		logger := funcr.NewJSON(func(obj string) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintln(w, obj)
		}, funcr.Options{LogTimestamp: true, TimestampFormat: "2006-01-02T15:04:05.000000Z07:00", LogCaller: funcr.All, Verbosity: 10})
		klog.SetLogger(logger)
		return nil
	}
	return fmt.Errorf("--log-format %q: want text or json", format)
}
