// Package logsink builds the logger every pathmend process logs through:
// klog's text format or the Kubernetes JSON schema (internal/logjson),
// written through the process's scrubber (package scrub), so no line
// carries a secret the process has seen, whatever logged it. main
// installs it as klog's logger; tests build one on a buffer of their own
// and hand it to the code under test (driver.Deps.Logger,
// klog.NewContext), so they see exactly the lines a node would, in
// parallel with other tests.
package logsink

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/pathmend/pathmend/internal/logjson"
	"github.com/pathmend/pathmend/pkg/scrub"
)

// New returns a logger writing format ("text" or "json") to w, through
// scrub.Default, and the options klog.SetLoggerWithOptions needs to keep
// klog's own text for printf-style calls. The logger passes every line it
// is handed, at any verbosity: klog applies -v and --vmodule before it
// hands one over, and a test wants every line.
func New(format string, w io.Writer) (logr.Logger, []klog.LoggerOption, error) {
	w = scrub.Default.Writer(w)
	switch format {
	case "text":
		l := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w), textlogger.Verbosity(math.MaxInt32)))
		var opts []klog.LoggerOption
		if kb, ok := l.GetSink().(textlogger.KlogBufferWriter); ok {
			opts = append(opts, klog.WriteKlogBuffer(kb.WriteKlogBuffer))
		}
		return l, opts, nil
	case "json":
		return logjson.New(w, time.Now), nil, nil
	}
	return logr.Logger{}, nil, fmt.Errorf("--logging-format %q: want text or json", format)
}
