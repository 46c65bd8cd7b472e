package volume

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestSecrets_NeverPrinted formats Secrets every way a log line or error
// could and checks that no value shows up, only presence.
func TestSecrets_NeverPrinted(t *testing.T) {
	s := Secrets{
		DHCHAPSecret:     "dhchap-host-value",
		DHCHAPCtrlSecret: "dhchap-ctrl-value",
		CHAPUsername:     "chap-user-value",
		CHAPPassword:     "chap-pass-value",
		CHAPUsernameIn:   "chap-user-in-value",
		CHAPPasswordIn:   "chap-pass-in-value",
	}
	values := []string{"dhchap-host-value", "dhchap-ctrl-value", "chap-user-value", "chap-pass-value", "chap-user-in-value", "chap-pass-in-value"}

	rendered := map[string]string{}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%T %v"} {
		rendered[verb] = fmt.Sprintf(verb, s)
	}
	rendered["pointer %v"] = fmt.Sprintf("%v", &s)
	rendered["in a struct %+v"] = fmt.Sprintf("%+v", struct{ S Secrets }{s})
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	rendered["json"] = string(b)
	b, err = json.Marshal(s.MarshalLog())
	if err != nil {
		t.Fatal(err)
	}
	rendered["MarshalLog"] = string(b)
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("Staging", "secrets", s)
	rendered["slog"] = buf.String()

	for how, out := range rendered {
		for _, v := range values {
			if strings.Contains(out, v) {
				t.Errorf("%s renders a secret value: %s", how, out)
			}
		}
	}
	if want := `{"dhchap":true,"dhchapCtrl":true,"chap":true,"chapIn":true}`; rendered["json"] != want {
		t.Errorf("json = %s, want %s", rendered["json"], want)
	}
	if want := "Secrets{dhchap:true dhchapCtrl:true chap:true chapIn:true}"; rendered["%d"] != want {
		t.Errorf("%%d = %s, want %s", rendered["%d"], want)
	}
}
