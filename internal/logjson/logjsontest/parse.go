// Package logjsontest parses the Kubernetes JSON log schema strictly, so
// tests can read pathmend's lines and a CSI sidecar's with one parser.
package logjsontest

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Line is one line of the Kubernetes JSON schema as a log pipeline reads
// it: the fixed keys first, in this order, then key/values.
type Line struct {
	Keys   []string // every key in order
	TS     float64
	Caller string
	Msg    string
	V      *int
	Err    *string
	Values map[string]any
}

var callerRE = regexp.MustCompile(`^[^/]+/[^/]+\.go:[1-9][0-9]*$`)

// Parse reads one line the way a pod's log pipeline would read every
// container's: it rejects what the schema does not allow (fixed keys out
// of order, ts not in epoch milliseconds, caller not "dir/file.go:line",
// an empty msg, a line that is neither info (v) nor error (err)).
func Parse(line string) (Line, error) {
	var l Line
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return l, fmt.Errorf("not a JSON object: %q", line)
	}
	l.Values = map[string]any{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return l, err
		}
		key := t.(string)
		var raw any
		if err := dec.Decode(&raw); err != nil {
			return l, err
		}
		l.Keys = append(l.Keys, key)
		switch key {
		case "ts":
			n, ok := raw.(json.Number)
			if !ok {
				return l, fmt.Errorf("ts %v is not a number", raw)
			}
			l.TS, _ = n.Float64()
		case "caller":
			l.Caller, _ = raw.(string)
		case "msg":
			l.Msg, _ = raw.(string)
		case "v":
			num, _ := raw.(json.Number)
			n, err := num.Int64()
			if err != nil {
				return l, fmt.Errorf("v %v is not an integer", raw)
			}
			v := int(n)
			l.V = &v
		case "err":
			s, _ := raw.(string)
			l.Err = &s
		default:
			l.Values[key] = raw
		}
	}
	if len(l.Keys) < 3 || l.Keys[0] != "ts" || l.Keys[1] != "caller" || l.Keys[2] != "msg" {
		return l, fmt.Errorf("keys %v: want ts, caller, msg first", l.Keys)
	}
	// Epoch milliseconds: 2001-09-09 is 1e12 ms, 2286 is 1e13 ms.
	if l.TS < 1e12 || l.TS >= 1e13 {
		return l, fmt.Errorf("ts %f is not epoch milliseconds", l.TS)
	}
	if !callerRE.MatchString(l.Caller) {
		return l, fmt.Errorf("caller %q is not dir/file.go:line", l.Caller)
	}
	if l.Msg == "" {
		return l, errors.New("empty msg")
	}
	if l.V == nil && l.Err == nil {
		return l, errors.New("neither v (info) nor err (error)")
	}
	if l.V != nil && l.Keys[3] != "v" {
		return l, fmt.Errorf("keys %v: v must follow msg", l.Keys)
	}
	return l, nil
}
