package report

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"strings"
	"time"
)

// LogLine is one line of pathmend's JSON log (--logging-format=json):
// its time, message and key/values as text.
type LogLine struct {
	At  time.Time
	Msg string
	KV  map[string]string
	// Err is the error of an error line.
	Err string
}

// ParseLog reads pathmend's JSON log; lines that are not JSON objects
// (a Go panic, output before the logger was set up) are skipped.
func ParseLog(r io.Reader) ([]LogLine, error) {
	var out []LogLine
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			continue
		}
		ts, _ := m["ts"].(float64)
		sec, frac := math.Modf(ts / 1000)
		l := LogLine{At: time.Unix(int64(sec), int64(frac*1e9)), KV: map[string]string{}}
		l.Msg, _ = m["msg"].(string)
		l.Err, _ = m["err"].(string)
		for k, v := range m {
			switch k {
			case "ts", "msg", "err", "caller", "v", "logger":
				continue
			}
			switch x := v.(type) {
			case string:
				l.KV[k] = x
			default:
				b, _ := json.Marshal(x)
				l.KV[k] = string(b)
			}
		}
		out = append(out, l)
	}
	return out, s.Err()
}

// Heal is one decision pathmend logged: a heal verdict (NVMe), an iSCSI
// session verdict, or a reconnect of a path.
type Heal struct {
	At time.Time
	// Kind is the defect ("ControllerNotContributing"), "iscsi
	// <kick>" for a session verdict, or "reconnect".
	Kind    string
	Verdict string
	// Names are the controllers a verdict named ("nvme3"), or the
	// session.
	Names  []string
	Reason string
}

// Heals picks pathmend's decisions out of its log.
func Heals(lines []LogLine) []Heal {
	var out []Heal
	for _, l := range lines {
		switch l.Msg {
		case "Heal verdict":
			h := Heal{At: l.At, Kind: l.KV["defect"], Verdict: l.KV["verdict"], Reason: l.KV["reason"]}
			for _, c := range strings.Split(l.KV["controllers"], ",") {
				if name, _, _ := strings.Cut(strings.TrimSpace(c), " "); name != "" {
					h.Names = append(h.Names, name)
				}
			}
			out = append(out, h)
		case "iSCSI session verdict":
			h := Heal{At: l.At, Kind: "iscsi " + l.KV["kick"], Verdict: l.KV["verdict"], Reason: l.KV["reason"]}
			if s := l.KV["session"]; s != "" {
				h.Names = []string{s}
			}
			out = append(out, h)
		case "Reconnected path":
			out = append(out, Heal{At: l.At, Kind: "reconnect", Verdict: "repaired", Reason: l.KV["nqn"] + " " + l.KV["endpoint"]})
		case "Path not reconnected":
			out = append(out, Heal{At: l.At, Kind: "reconnect", Verdict: "failed", Reason: l.KV["endpoint"] + ": " + l.Err})
		}
	}
	return out
}
