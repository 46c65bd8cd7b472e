package uevent_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pathmend/pathmend/pkg/uevent"
	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// FuzzParse: whatever the socket delivers, Parse never panics, and what it
// accepts has the four keys every kernel uevent has, round-trips through
// Encode, and names its objects without panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte(loopChange))
	f.Add([]byte("libudev\x00"))
	f.Add([]byte("add@/\x00ACTION=add\x00DEVPATH=/\x00SUBSYSTEM=\x00SEQNUM=0\x00"))
	if recs, err := ueventtest.LoadAll("../../" + ueventtest.Dir); err == nil {
		for _, r := range recs {
			evs, err := r.ParsedEvents()
			if err != nil {
				f.Fatal(err)
			}
			for _, e := range evs {
				f.Add(uevent.Encode(e))
			}
		}
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		e, err := uevent.Parse(msg)
		if err != nil {
			return
		}
		for _, k := range []string{"ACTION", "DEVPATH", "SUBSYSTEM", "SEQNUM"} {
			if e.Env[k] == "" {
				t.Fatalf("accepted without %s: %q", k, msg)
			}
		}
		again, err := uevent.Parse(uevent.Encode(e))
		if err != nil {
			t.Fatalf("Encode of an accepted message does not parse: %v", err)
		}
		if diff := cmp.Diff(e, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip (-first +again):\n%s", diff)
		}
		_ = uevent.Objects(e)
		_ = uevent.Relevant(e)
	})
}
