package kmsg

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParse_ReadsTheHeaderAndDecodesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      Record
	}{
		{
			name: "ext4 journal abort",
			raw:  "3,1204,84512345,-;EXT4-fs error (device dm-0): ext4_journal_check_start:83: comm kworker/u4:2: Detected aborted journal\n",
			want: Record{Seq: 1204, Level: 3, At: 84512345 * time.Microsecond, Msg: "EXT4-fs error (device dm-0): ext4_journal_check_start:83: comm kworker/u4:2: Detected aborted journal"},
		},
		{
			name: "dictionary lines and a facility",
			raw:  "30,7,1000000,c;udevd[211]: starting\n SUBSYSTEM=block\n DEVICE=b8:0\n",
			want: Record{Seq: 7, Level: 6, Facility: 3, At: time.Second, Msg: "udevd[211]: starting"},
		},
		{
			name: "escaped bytes",
			raw:  `4,9,5,-;tab\x09and backslash\x5c end`,
			want: Record{Seq: 9, Level: 4, At: 5 * time.Microsecond, Msg: "tab\tand backslash\\ end"},
		},
		{
			name: "a header with more fields",
			raw:  "6,10,20,-,caller=T1;msg",
			want: Record{Seq: 10, Level: 6, At: 20 * time.Microsecond, Msg: "msg"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("Parse (-want +got):\n%s", d)
			}
		})
	}
}

func TestParse_RefusesMalformedHeaders(t *testing.T) {
	for _, raw := range []string{
		"no separator",
		"6,1,2;too few fields",
		"x,1,2,-;bad prefix",
		"6,-1,2,-;bad sequence",
		"6,1,99999999999999999999,-;timestamp overflows",
	} {
		if r, err := Parse(raw); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", raw, r)
		}
	}
}

func TestRecord_StringLooksLikeDmesg(t *testing.T) {
	r := Record{At: 84*time.Second + 512345*time.Microsecond, Msg: "hello"}
	if got, want := r.String(), "[   84.512345] hello"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// On a machine whose /dev/kmsg is readable, Since and Cursor agree: the
// cursor is the newest record, and nothing is newer than it.
func TestSince_CursorIsTheNewestRecord(t *testing.T) {
	if _, err := os.Stat(Path); err != nil {
		t.Skipf("no %s here: %v", Path, err)
	}
	cur, err := Cursor(Path)
	if err != nil {
		t.Skipf("%s not readable: %v", Path, err)
	}
	rs, err := Since(Path, cur)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Seq <= cur {
			t.Errorf("Since(%d) returned record %d", cur, r.Seq)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("3,1204,84512345,-;EXT4-fs error (device dm-0)\n KEY=v")
	f.Add(`4,9,5,-;a\x0`)
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := Parse(raw)
		if err == nil && r.At < 0 {
			t.Errorf("negative time %v from %q", r.At, raw)
		}
	})
}

// Follow returns when its context ends, also when the kernel logs nothing.
func TestFollow_EndsWithItsContext(t *testing.T) {
	if _, err := Cursor(Path); err != nil {
		t.Skipf("%s not readable: %v", Path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Follow(ctx, Path, 10*time.Millisecond, func(Record) {}); err != nil {
		t.Fatal(err)
	}
}
