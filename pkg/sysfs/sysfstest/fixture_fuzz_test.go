package sysfstest

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzParseFixture: the parser never panics, and whatever it accepts
// re-encodes to text that parses back to the same fixture.
func FuzzParseFixture(f *testing.F) {
	f.Add([]byte(sampleFixture))
	f.Add([]byte(FixtureMagic + "\n"))
	f.Add([]byte(FixtureMagic + "\nlink \"a b\" \"../c d\"\n"))
	f.Add([]byte(FixtureMagic + "\nerr a 0000 \"E NOT\"\n# late comment\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fx, err := ParseFixture(bytes.NewReader(data))
		if err != nil {
			return
		}
		enc, err := fx.Bytes()
		if err != nil {
			t.Fatalf("encode of a parsed fixture failed: %v", err)
		}
		again, err := ParseFixture(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("re-parse failed: %v\n%s", err, enc)
		}
		if diff := cmp.Diff(fx, again); diff != "" {
			t.Fatalf("round trip changed the fixture (-first +second):\n%s", diff)
		}
	})
}
