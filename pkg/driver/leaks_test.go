package driver_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/pathmend/pathmend/internal/logsink"
)

// logBuffer is one test's log output: the lines the production sink
// (internal/logsink: klog's text or the JSON schema, through the process's
// scrubber) writes, at every verbosity. Tests hand its logger to the
// driver (Deps.Logger), so they run in parallel without touching klog's
// global output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newLogs returns a logger in format ("text" or "json") writing to a new
// buffer.
func newLogs(t *testing.T, format string) (logr.Logger, *logBuffer) {
	t.Helper()
	b := &logBuffer{}
	l, _, err := logsink.New(format, b)
	if err != nil {
		t.Fatal(err)
	}
	return l, b
}

// spellings are the forms a text may carry secret v in: as is, escaped
// for JSON and Go strings (once and twice), base64 (both alphabets,
// padded or not), hex (both cases), URL-escaped.
func spellings(v string) map[string]string {
	j, _ := json.Marshal(v)
	q := strconv.Quote(v)
	jq, _ := json.Marshal(q)
	m := map[string]string{
		"as is":          v,
		"JSON":           strings.Trim(string(j), `"`),
		"Go quoted":      strings.Trim(q, `"`),
		"JSON of quoted": strings.Trim(string(jq), `"`),
		"base64":         base64.StdEncoding.EncodeToString([]byte(v)),
		"base64 raw url": base64.RawURLEncoding.EncodeToString([]byte(v)),
		"hex":            hex.EncodeToString([]byte(v)),
		"HEX":            strings.ToUpper(hex.EncodeToString([]byte(v))),
		"query-escaped":  url.QueryEscape(v),
		"path-escaped":   url.PathEscape(v),
	}
	return m
}

// noLeak fails t when text holds any spelling of any secret; what names
// the text ("the answer", "the text log").
func noLeak(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		for name, sp := range spellings(s) {
			if i := strings.Index(text, sp); i >= 0 {
				t.Errorf("%s holds a secret (%s): …%s…", what, name, text[max(0, i-120):min(len(text), i+len(sp)+40)])
			}
		}
	}
}
