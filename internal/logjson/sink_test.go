package logjson

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/internal/logjson/logjsontest"
)

// registrarLines are lines node-driver-registrar v2.11.0 wrote with
// --logging-format=json (k8s.io/component-base/logs/json), quoted as they
// were published in kubernetes-csi/node-driver-registrar issue 431.
const registrarLines = `{"ts":1721376983734.9492,"caller":"csi-node-driver-registrar/main.go:150","msg":"Version","v":0,"version":"v2.11.0"}
{"ts":1721376983734.9775,"caller":"csi-node-driver-registrar/main.go:172","msg":"Attempting to open a gRPC connection","v":1,"csiAddress":"/csi/csi.sock"}
{"ts":1721376987793.6306,"caller":"csi-node-driver-registrar/node_register.go:56","msg":"Starting Registration Server","v":0,"socketPath":"/registration/ebs.csi.aws.com-reg.sock"}
`

func parseAll(t *testing.T, r io.Reader) []logjsontest.Line {
	t.Helper()
	var out []logjsontest.Line
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l, err := logjsontest.Parse(sc.Text())
		if err != nil {
			t.Errorf("%v\nline: %s", err, sc.Text())
			continue
		}
		out = append(out, l)
	}
	return out
}

var fixedNow = time.Date(2026, 11, 1, 10, 0, 0, 123456000, time.UTC)

// useSink routes klog to a fresh sink at verbosity v and returns what
// it writes.
func useSink(t *testing.T, v string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.PanicOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", v); err != nil {
		t.Fatal(err)
	}
	klog.SetLogger(New(&buf, func() time.Time { return fixedNow }))
	t.Cleanup(func() {
		klog.ClearLogger()
		_ = fs.Set("v", "0")
	})
	return &buf
}

func line() int {
	_, _, l, _ := runtime.Caller(1)
	return l
}

type secretless struct{ A int }

type kobj struct{}

func (kobj) GetName() string      { return "pv-1" }
func (kobj) GetNamespace() string { return "" }

func TestSink_WritesTheKubernetesSchema(t *testing.T) {
	buf := useSink(t, "4")
	l1 := line() + 1
	klog.InfoS("Heal verdict", "verdict", "deferred", "cooldown", 1500*time.Millisecond, "paths", 2, "ok", true)
	l2 := line() + 1
	klog.V(4).InfoS("RPC", "method", "/csi.v1.Node/NodeStageVolume", "record", secretless{A: 1}, "pv", klog.KObj(kobj{}))
	l3 := line() + 1
	klog.ErrorS(errors.New("connect: -111"), "Connect failed", "nqn", "nqn.2014-08.io.pathmend:a<b>")
	klog.V(5).InfoS("Not logged at -v=4")

	ts := "1793527200123.456"
	want := fmt.Sprintf(`{"ts":%s,"caller":"logjson/sink_test.go:%d","msg":"Heal verdict","v":0,"verdict":"deferred","cooldown":"1.5s","paths":2,"ok":true}
{"ts":%s,"caller":"logjson/sink_test.go:%d","msg":"RPC","v":4,"method":"/csi.v1.Node/NodeStageVolume","record":{"A":1},"pv":{"name":"pv-1"}}
{"ts":%s,"caller":"logjson/sink_test.go:%d","msg":"Connect failed","nqn":"nqn.2014-08.io.pathmend:a<b>","err":"connect: -111"}
`, ts, l1, ts, l2, ts, l3)
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}

// TestSink_OneParserReadsPathmendAndTheRegistrar parses pathmend's lines
// and node-driver-registrar's with the same parser: same fixed keys in
// the same order, ts in the same unit, caller in the same form.
func TestSink_OneParserReadsPathmendAndTheRegistrar(t *testing.T) {
	registrar := parseAll(t, strings.NewReader(registrarLines))
	buf := useSink(t, "2")
	klog.InfoS("Serving CSI", "endpoint", "unix:///csi/csi.sock")
	klog.V(2).InfoS("Staged volume", "volumeID", "v1")
	klog.ErrorS(errors.New("boom"), "Monitor tick failed")
	ours := parseAll(t, buf)
	if len(registrar) != 3 || len(ours) != 3 {
		t.Fatalf("parsed %d registrar and %d pathmend lines, want 3 and 3", len(registrar), len(ours))
	}
	for i, pair := range [][2]logjsontest.Line{{registrar[0], ours[0]}, {registrar[1], ours[1]}} {
		if diff := cmp.Diff(pair[0].Keys[:4], pair[1].Keys[:4]); diff != "" {
			t.Errorf("pair %d: fixed keys differ (-registrar +pathmend):\n%s", i, diff)
		}
	}
	if *ours[1].V != 2 || ours[2].V != nil || *ours[2].Err != "boom" {
		t.Errorf("v/err: %+v %+v", ours[1], ours[2])
	}
	// The same clock reads as the same instant in both: within a day of
	// each other only if both are milliseconds.
	got := time.UnixMilli(int64(ours[0].TS))
	if !got.Equal(fixedNow.Truncate(time.Millisecond)) {
		t.Errorf("ts reads as %v, want %v", got, fixedNow)
	}
}

func TestSink_WithNameWithValuesAndOddPairs(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, func() time.Time { return fixedNow }).WithName("monitor").WithValues("node", "n1")
	log.Info("Tick", "missing")
	var typedNil *net
	log.Info("Odd", 7, typedNil)
	out := buf.String()
	for _, want := range []string{`"logger":"monitor","node":"n1","missing":null}`, `"7":"<panic:`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	parseAll(t, &buf)
}

type net struct{ name string }

func (n *net) String() string { return n.name }
