package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
)

// RPC is one CSI call pathmend logged (`--logging-format=json -v=5`: the
// interceptor's "RPC request" line, the request with secrets stripped, as
// JSON), with the error if it failed.
type RPC struct {
	// Event marks not a call but pathmend's own record of one that
	// finished: Method is "Staged volume" or "Unstaged volume".
	Event    bool
	Line     int    // 1-based line of the request in the log
	Time     string // the line's ts: milliseconds since the Unix epoch
	Method   string // NodeStageVolume, NodePublishVolume, …
	VolumeID string
	Request  string
	Error    string // from the matching "RPC failed" line, if any
	// Done is the line that ended the call, when the log shows it: its
	// "RPC failed" line, or for a NodeStageVolume its "Staged volume" or
	// "Volume already staged" line, for a NodeUnstageVolume its "Unstaged
	// volume" line. 0 while unknown (a success of any other method:
	// pathmend's response line names no volume).
	Done int
}

// inFlight reports whether a call on r's volume that r's log line
// follows had not ended by then: another NodeStageVolume still
// connecting, say, when kubelet gave up on it and sent it again.
func inFlight(rpcs []RPC, r RPC) bool {
	for _, q := range rpcs {
		if q.Line >= r.Line {
			break
		}
		if !q.Event && q.VolumeID == r.VolumeID && q.Method == r.Method && (q.Done == 0 || q.Done > r.Line) {
			return true
		}
	}
	return false
}

// Field returns a string field of the request ("staging_target_path",
// "target_path"), "" when absent.
func (r RPC) Field(name string) string {
	var fields map[string]any
	if json.Unmarshal([]byte(r.Request), &fields) != nil {
		return ""
	}
	s, _ := fields[name].(string)
	return s
}

// readRPCs parses pathmend's JSON log. A failure is matched to the
// latest earlier request of the same method and volume.
func readRPCs(path string) ([]RPC, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rpcs []RPC
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var obj struct {
			TS       json.Number `json:"ts"`
			Msg      string      `json:"msg"`
			Method   string      `json:"method"`
			VolumeID string      `json:"volumeID"`
			Request  string      `json:"request"`
			Err      string      `json:"err"`
			Error    string      `json:"error"`
		}
		if json.Unmarshal(line, &obj) != nil {
			continue
		}
		method := obj.Method[strings.LastIndexByte(obj.Method, '/')+1:]
		switch obj.Msg {
		case "RPC request":
			r := RPC{Line: n, Time: obj.TS.String(), Method: method, Request: obj.Request}
			r.VolumeID = r.Field("volume_id")
			rpcs = append(rpcs, r)
		case "Staged volume", "Volume already staged", "Unstaged volume":
			ended := "NodeStageVolume"
			if obj.Msg == "Unstaged volume" {
				ended = "NodeUnstageVolume"
			}
			for i := range rpcs {
				if !rpcs[i].Event && rpcs[i].Method == ended && rpcs[i].VolumeID == obj.VolumeID && rpcs[i].Done == 0 {
					rpcs[i].Done = n
					break
				}
			}
			if obj.Msg != "Volume already staged" {
				rpcs = append(rpcs, RPC{Event: true, Line: n, Time: obj.TS.String(), Method: obj.Msg, VolumeID: obj.VolumeID})
			}
		case "RPC failed":
			msg := obj.Err
			if msg == "" {
				msg = obj.Error
			}
			for i := len(rpcs) - 1; i >= 0; i-- {
				if !rpcs[i].Event && rpcs[i].Method == method && rpcs[i].VolumeID == obj.VolumeID && rpcs[i].Error == "" {
					rpcs[i].Error = msg
					rpcs[i].Done = n
					break
				}
			}
		}
	}
	return rpcs, sc.Err()
}

// calls returns the calls of method on volumeID, in order.
func calls(rpcs []RPC, method, volumeID string) []RPC {
	var out []RPC
	for _, r := range rpcs {
		if !r.Event && r.Method == method && (volumeID == "" || r.VolumeID == volumeID) {
			out = append(out, r)
		}
	}
	return out
}
