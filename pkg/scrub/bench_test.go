package scrub

import (
	"fmt"
	"io"
	"testing"

	"k8s.io/klog/v2/textlogger"
)

// A log line as klog writes one at -v=4.
var benchLine = []byte(`I1204 17:46:19.312866    9834 node_publish.go:214] "Published volume" volumeID="pvc-6f1d3c2a-90b1-4c57-8e0e-0d1a4f1b2c3d" targetPath="/var/lib/kubelet/pods/0f5c6a43-2f0e-4b1c-9d6a-3c1e2b4a5d6f/volumes/kubernetes.io~csi/pvc-6f1d3c2a-90b1-4c57-8e0e-0d1a4f1b2c3d/mount" readOnly=false accessType="mount" mount=812` + "\n")

// BenchmarkString measures the scrubber on one log line that holds no
// secret, as almost every line does: with a set that knows nothing, and
// with sets that know the secrets of 1, 100 and 1,000 volumes (four CHAP
// values each).
func BenchmarkString(b *testing.B) {
	for _, volumes := range []int{0, 1, 100, 1000} {
		s := New()
		for v := range volumes {
			s.Add(CHAPUser, fmt.Sprintf("user-%04d", v))
			s.Add(CHAPPassword, fmt.Sprintf("password-%04d-x8Gq", v))
			s.Add(MutualCHAPUser, fmt.Sprintf("target-%04d", v))
			s.Add(MutualCHAPPassword, fmt.Sprintf("target-pass-%04d-Zr2", v))
		}
		b.Run(fmt.Sprintf("volumes=%d", volumes), func(b *testing.B) {
			b.SetBytes(int64(len(benchLine)))
			b.ReportAllocs()
			for b.Loop() {
				_ = s.Bytes(benchLine)
			}
		})
	}
}

// BenchmarkString_Secret is a line that holds a secret: the replacement's
// cost.
func BenchmarkString_Secret(b *testing.B) {
	s := New()
	s.Add(CHAPPassword, "password-0001-x8Gq")
	line := append(append([]byte(nil), benchLine[:len(benchLine)-1]...), " out=\"node.session.auth.password = password-0001-x8Gq\"\n"...)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Bytes(line)
	}
}

// BenchmarkAdd is the cost of learning one value (its forms indexed).
func BenchmarkAdd(b *testing.B) {
	s := New()
	i := 0
	for b.Loop() {
		s.Add(CHAPPassword, fmt.Sprintf("password-%08d", i))
		i++
	}
}

// BenchmarkLogLine puts the scrubber's cost beside a log line's: one
// structured line formatted by klog's text logger (as pathmend's text
// format writes it) to a discarding writer, without and with the
// scrubber of a set that knows 1,000 volumes' CHAP values in front of
// the writer. Compare the two in one run.
func BenchmarkLogLine(b *testing.B) {
	s := New()
	for v := range 1000 {
		s.Add(CHAPUser, fmt.Sprintf("user-%04d", v))
		s.Add(CHAPPassword, fmt.Sprintf("password-%04d-x8Gq", v))
		s.Add(MutualCHAPUser, fmt.Sprintf("target-%04d", v))
		s.Add(MutualCHAPPassword, fmt.Sprintf("target-pass-%04d-Zr2", v))
	}
	for _, c := range []struct {
		name string
		w    io.Writer
	}{{"plain", io.Discard}, {"scrubbed", s.Writer(io.Discard)}} {
		logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(c.w), textlogger.Verbosity(5)))
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				logger.V(2).Info("Published volume", "volumeID", "pvc-6f1d3c2a-90b1-4c57-8e0e-0d1a4f1b2c3d",
					"targetPath", "/var/lib/kubelet/pods/0f5c6a43-2f0e-4b1c-9d6a-3c1e2b4a5d6f/volumes/kubernetes.io~csi/pvc-6f1d3c2a-90b1-4c57-8e0e-0d1a4f1b2c3d/mount",
					"readOnly", false, "accessType", "mount", "mount", 812)
			}
		})
	}
}
