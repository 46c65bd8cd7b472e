package driver

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBoundMessage_CutsAtARuneBoundaryAndMarksTheCut(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		limit    int
		want     string
	}{
		{"short stays", "path lost", 1024, "path lost"},
		{"exactly the limit stays", strings.Repeat("a", 16), 16, strings.Repeat("a", 16)},
		{"long is cut and marked", strings.Repeat("a", 20), 16, strings.Repeat("a", 12) + cutMark},
		// "é" is two bytes: the cut backs off to the start of the rune.
		{"no half rune", "aaaaaaaaaaaé" + strings.Repeat("b", 10), 16, "aaaaaaaaaaa" + cutMark},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := boundMessage(tc.in, tc.limit)
			if got != tc.want || len(got) > tc.limit || !utf8.ValidString(got) {
				t.Errorf("boundMessage(%q, %d) = %q (%d bytes), want %q", tc.in, tc.limit, got, len(got), tc.want)
			}
		})
	}
}

func TestJoinBounded_NamesWhatFitsAndCountsTheRest(t *testing.T) {
	msg := func(i int) string {
		return "nqn.2024-01.io.example:array (volume vol-" + strings.Repeat("x", 60) + string(rune('a'+i%26)) + "): 1 of 2 paths live"
	}
	var many []string
	for i := 0; i < 40; i++ {
		many = append(many, msg(i))
	}
	for _, tc := range []struct {
		name  string
		msgs  []string
		check func(t *testing.T, got string)
	}{
		{"what fits is joined as it is", []string{"a", "b"}, func(t *testing.T, got string) {
			if got != "a; b" {
				t.Errorf("got %q, want %q", got, "a; b")
			}
		}},
		{"40 volumes: whole messages, then the count", many, func(t *testing.T, got string) {
			named := strings.Count(got, "(volume ")
			if !strings.HasSuffix(got, "; and "+strconv.Itoa(40-named)+" more") || named == 0 || named >= 40 {
				t.Errorf("got %d named volumes and the tail %q", named, got[max(0, len(got)-40):])
			}
			for _, part := range strings.Split(strings.TrimSuffix(got, "; and "+strconv.Itoa(40-named)+" more"), "; ") {
				if !strings.HasSuffix(part, "paths live") {
					t.Errorf("a named volume's message was cut: %q", part)
				}
			}
		}},
		{"a first message too long alone is cut", []string{strings.Repeat("é", 2000), "b"}, func(t *testing.T, got string) {
			if !strings.HasSuffix(got, cutMark+"; and 1 more") {
				t.Errorf("tail %q", got[max(0, len(got)-40):])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := joinBounded(tc.msgs)
			if len(got) > maxHealthMessageBytes || !utf8.ValidString(got) {
				t.Errorf("%d bytes (valid UTF-8: %v), Kubernetes keeps at most %d", len(got), utf8.ValidString(got), maxHealthMessageBytes)
			}
			tc.check(t, got)
		})
	}
}
