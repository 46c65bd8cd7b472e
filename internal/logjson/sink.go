package logjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// New returns a logger writing the Kubernetes JSON schema to w, one
// line per call. now stamps each line (time.Now in production). Writes
// from concurrent calls never interleave.
func New(w io.Writer, now func() time.Time) logr.Logger {
	return logr.New(&sink{out: &output{w: w}, now: now})
}

// output is the writer every sink derived from one New shares.
type output struct {
	mu sync.Mutex
	w  io.Writer
}

// sink implements logr.LogSink and logr.CallDepthLogSink. Values are
// immutable: WithValues, WithName and WithCallDepth return copies.
type sink struct {
	out    *output
	now    func() time.Time
	depth  int
	name   string
	values []any
}

var (
	_ logr.LogSink          = (*sink)(nil)
	_ logr.CallDepthLogSink = (*sink)(nil)
)

// Init records how many frames logr's own wrappers add.
func (s *sink) Init(info logr.RuntimeInfo) { s.depth += info.CallDepth }

// Enabled is always true: klog has already applied -v and --vmodule when
// it calls the sink.
func (s *sink) Enabled(int) bool { return true }

// Info writes an info line with its verbosity.
func (s *sink) Info(level int, msg string, kv ...any) {
	s.write(level, nil, false, msg, kv)
}

// Error writes an error line: no verbosity, the error last as "err".
func (s *sink) Error(err error, msg string, kv ...any) {
	s.write(0, err, true, msg, kv)
}

func (s *sink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any(nil), s.values...), kv...)
	return &c
}

func (s *sink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (s *sink) WithCallDepth(depth int) logr.LogSink {
	c := *s
	c.depth += depth
	return &c
}

// sinkFrames is the frames write and Info/Error add above the logr call;
// s.depth counts logr's own (Init) and those of wrappers such as klog.
const sinkFrames = 2

func (s *sink) write(level int, err error, isError bool, msg string, kv []any) {
	var b bytes.Buffer
	b.WriteString(`{"ts":`)
	ms := float64(s.now().UnixNano()) / float64(time.Millisecond)
	b.WriteString(strconv.FormatFloat(ms, 'f', -1, 64))
	if _, file, line, ok := runtime.Caller(s.depth + sinkFrames); ok {
		b.WriteString(`,"caller":`)
		writeString(&b, filepath.Base(filepath.Dir(file))+"/"+filepath.Base(file)+":"+strconv.Itoa(line))
	}
	b.WriteString(`,"msg":`)
	writeString(&b, msg)
	if !isError {
		b.WriteString(`,"v":`)
		b.WriteString(strconv.Itoa(level))
	}
	if s.name != "" {
		b.WriteString(`,"logger":`)
		writeString(&b, s.name)
	}
	writePairs(&b, s.values)
	writePairs(&b, kv)
	if err != nil {
		b.WriteString(`,"err":`)
		writeString(&b, err.Error())
	}
	b.WriteString("}\n")
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	_, _ = s.out.w.Write(b.Bytes())
}

// writePairs appends key/value pairs; a key that is not a string is
// written as its text, a missing last value as null (as zapr does, the
// line is kept rather than dropped).
func writePairs(b *bytes.Buffer, kv []any) {
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = fmt.Sprint(kv[i])
		}
		b.WriteByte(',')
		writeString(b, key)
		b.WriteByte(':')
		if i+1 < len(kv) {
			writeValue(b, kv[i+1])
		} else {
			b.WriteString("null")
		}
	}
}

func writeString(b *bytes.Buffer, s string) {
	_ = writeJSON(b, s) // a string always encodes
}

// writeValue encodes one value (see the package comment for the rules).
func writeValue(b *bytes.Buffer, v any) {
	if m, ok := v.(logr.Marshaler); ok {
		v = m.MarshalLog()
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
		return
	case string:
		writeString(b, x)
		return
	case error:
		writeString(b, safeText(x.Error))
		return
	case fmt.Stringer:
		writeString(b, safeText(x.String))
		return
	}
	if err := writeJSON(b, v); err != nil {
		writeString(b, fmt.Sprintf("%+v", v))
	}
}

// safeText calls Error or String; a typed nil that panics in it is
// logged as the panic, never crashes the caller.
func safeText(f func() string) (s string) {
	defer func() {
		if r := recover(); r != nil {
			s = fmt.Sprintf("<panic: %v>", r)
		}
	}()
	return f()
}

// writeJSON appends v as JSON without HTML escaping (as zap writes it:
// "<" stays "<"), or returns the error and appends nothing.
func writeJSON(b *bytes.Buffer, v any) error {
	var tmp bytes.Buffer
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b.Write(bytes.TrimSuffix(tmp.Bytes(), []byte("\n")))
	return nil
}
