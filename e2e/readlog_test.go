//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// klog writes an error with newlines as a multi-line value; the record's
// other keys follow on a line starting with " >". A verdict line with an
// iscsiadm error must keep its verdict, portal and kick.
func TestReadLog_MultiLineValueKeepsTheRecordsKeys(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	err := os.WriteFile(p, []byte("I1202 04:07:33.661751    1986 healer_decide.go:144] \"Kicking iSCSI session\" session=\"session13\" kick=\"logout-login\"\n"+
		"E1202 04:08:21.367595    1986 healer_decide.go:402] \"iSCSI session verdict\" err=<\n"+
		"\tlogin iqn 127.0.0.2:3260: iscsiadm: exit 8\n"+
		"\tsecond line\n"+
		" > verdict=\"failed\" session=\"session13\" portal=\"127.0.0.2:3260\" kick=\"logout-login\" reason=\"logout-login failed; pathmend logs it in again after the cooldown\"\n"+
		"I1202 04:08:22.477636    1986 healer_decide.go:144] \"Kicking iSCSI session\" session=\"session0\" kick=\"login\"\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ls := readLog(t, p)
	if len(ls) != 3 {
		t.Fatalf("%d lines", len(ls))
	}
	v := withMsg(ls, "iSCSI session verdict")
	if len(v) != 1 || v[0].KV["verdict"] != "failed" || v[0].KV["portal"] != "127.0.0.2:3260" || v[0].KV["kick"] != "logout-login" || v[0].KV["err"] != "<" {
		t.Fatalf("%+v", v)
	}
	if ls[2].KV["kick"] != "login" || ls[0].KV["session"] != "session13" {
		t.Fatalf("%+v", ls)
	}
	if v[0].KV["reason"] != "logout-login failed; pathmend logs it in again after the cooldown" {
		t.Fatalf("reason %q", v[0].KV["reason"])
	}
}
