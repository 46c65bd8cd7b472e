//go:build e2e

package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/kmsg"
)

// pathmend's monitor logs "Monitor tick" (with its number) at the start of
// every tick at -v=4, the level every test runs it at. A property such as
// "reconnected within two ticks" is asserted in these ticks: a loaded
// guest runs ticks late, and a bound in seconds would turn a slow machine
// into a red test, while a count of ticks does not move.

// tickStarts returns when each tick in lines started, in log order.
func tickStarts(lines []logLine) []time.Time {
	var out []time.Time
	for _, l := range lines {
		if l.Msg == "Monitor tick" {
			out = append(out, logAt(l))
		}
	}
	return out
}

// ticksBetween counts the ticks in lines that started after from and no
// later than to.
func ticksBetween(lines []logLine, from, to time.Time) int {
	n := 0
	for _, at := range tickStarts(lines) {
		if at.After(from) && !at.After(to) {
			n++
		}
	}
	return n
}

// tickLimit is the safety net of a wait for what pathmend does within n
// monitor ticks: a minute plus 20 s a tick. The tests tick every second,
// and a tick took 3 s with the host's load average at 24: the limit is
// ~7x the slowest tick seen plus a minute for the RPC or scrape that reads
// the answer.
func tickLimit(n int) time.Duration {
	return time.Minute + time.Duration(n)*20*time.Second
}

// waitTicks waits until the log at path shows n ticks started after from,
// and returns the log's lines (limit: tickLimit(n)).
func waitTicks(t *testing.T, path string, from time.Time, n int) []logLine {
	t.Helper()
	var lines []logLine
	eventually(t, tickLimit(n), "pathmend's log to show "+strconv.Itoa(n)+" more monitor ticks", func() bool {
		lines = readLog(t, path)
		return ticksBetween(lines, from, time.Now().Add(time.Hour)) >= n
	})
	return lines
}

// kernelEvent waits for the first kernel log record after cursor whose
// message holds every one of subs, and returns when it was logged on
// the wall clock (pathmend's log's clock): the kernel stamps a record
// with its time since boot, which /proc/uptime reads on the same clock.
// The kernel's records mark the moments a test cannot see from outside
// as exactly: a target port starting to listen, a host's connect
// reaching the target.
func kernelEvent(t *testing.T, cursor uint64, what string, subs ...string) time.Time {
	t.Helper()
	var at time.Duration
	eventually(t, 2*time.Minute, "the kernel to log "+what, func() bool {
		rs, err := kmsg.Since(kmsg.Path, cursor)
		if err != nil {
			t.Fatalf("kernel log: %v", err)
		}
	next:
		for _, r := range rs {
			for _, s := range subs {
				if !strings.Contains(r.Msg, s) {
					continue next
				}
			}
			at = r.At
			return true
		}
		return false
	})
	return time.Now().Add(at - uptime(t))
}

// kernelCursor is the kernel log's newest record now.
func kernelCursor(t *testing.T) uint64 {
	t.Helper()
	c, err := kmsg.Cursor(kmsg.Path)
	if err != nil {
		t.Fatalf("kernel log: %v", err)
	}
	return c
}
