package heal

import "testing"

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{in: "repair", want: ModeRepair},
		{in: "observe", want: ModeObserve},
		{in: "off", want: ModeOff},
		{in: "", wantErr: true},
		{in: "Repair", wantErr: true},
		{in: "on", wantErr: true},
	} {
		got, err := ParseMode(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseMode(%q) error = %v, wantErr %t", tc.in, err, tc.wantErr)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseMode(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
