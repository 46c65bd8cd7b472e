// Package logjson is the JSON log format of `pathmend serve
// --logging-format=json`: a logr sink that writes klog's calls as the
// Kubernetes JSON schema (k8s.io/component-base/logs/json), the one
// kubelet, the control plane and the CSI sidecars in pathmend's pod
// (node-driver-registrar, livenessprobe) write with the same flag, so one
// log pipeline parses the whole pod.
//
// One line per call, one JSON object per line, keys in this order:
//
//	ts       float, milliseconds since the Unix epoch (1719254704626.5413)
//	caller   "dir/file.go:line" of the log call (the file's directory and name)
//	msg      the constant message
//	v        the verbosity of an info line (0 for klog.InfoS, 4 for V(4));
//	         error lines have none
//	logger   the logger's name, when it has one
//	...      the structured key/value pairs, in call order
//	err      the error of an error line (klog.ErrorS), as its Error() text
//
// Values are written as JSON: strings, numbers and booleans as they are,
// an error or a fmt.Stringer (a time.Duration: "1.5s") as its text, a
// logr.Marshaler as what it marshals to, anything else through
// encoding/json, falling back to its %+v text.
//
// The package owns only the encoding. It does not decide what is logged:
// klog's -v and --vmodule filter before a call reaches the sink, which is
// installed with klog.SetLogger. It never logs on its own, and it drops no
// key, so keeping secrets out of a log line stays the caller's duty.
package logjson
