package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const (
	password = `s3cr"et/pa ss+w0rd&<x>`
	user     = "chap-user-0042"
	dhchap   = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
)

// spellings are the forms a text may carry a secret in.
func spellings(v string) map[string]string {
	j, _ := json.Marshal(v)
	q := strconv.Quote(v)
	jq, _ := json.Marshal(q)
	m := map[string]string{
		"raw":                                  v,
		"json":                                 string(j),
		"go quoted":                            q,
		"json of quoted":                       string(jq),
		"base64":                               base64.StdEncoding.EncodeToString([]byte(v)),
		"base64 url raw":                       base64.RawURLEncoding.EncodeToString([]byte(v)),
		"base64 of user:password (HTTP basic)": base64.StdEncoding.EncodeToString([]byte("someone:" + v)),
		"base64 at offset 2":                   base64.StdEncoding.EncodeToString([]byte("ab" + v + "cd")),
		"hex":                                  hex.EncodeToString([]byte(v)),
		"HEX":                                  strings.ToUpper(hex.EncodeToString([]byte(v))),
		"query escaped":                        url.QueryEscape(v),
		"path escaped":                         url.PathEscape(v),
		"lower escapes":                        strings.ToLower(url.QueryEscape(v)),
	}
	return m
}

// leaks reports the first spelling of v still in text.
func leaks(t *testing.T, text, v string) {
	t.Helper()
	for name, sp := range spellings(v) {
		core := sp
		if strings.HasPrefix(name, "base64 of") || strings.HasPrefix(name, "base64 at") {
			// Only the part made of v's bits says anything about v.
			continue
		}
		if strings.Contains(text, core) {
			t.Errorf("the %s spelling %q is still in %q", name, core, text)
		}
	}
	if strings.Contains(text, v) {
		t.Errorf("the value is still in %q", text)
	}
}

func TestString_ReplacesEverySpelling(t *testing.T) {
	s := New()
	s.Add(CHAPPassword, password)
	for name, sp := range spellings(password) {
		text := "iscsiadm: login failed, record says: " + sp + " (exit 24)"
		got := s.String(text)
		if got == text {
			t.Errorf("%s: nothing replaced in %q", name, text)
			continue
		}
		leaks(t, got, password)
		if !strings.Contains(got, Replacement) || !strings.HasPrefix(got, "iscsiadm: login failed") {
			t.Errorf("%s: %q", name, got)
		}
	}
}

// TestString_EncodedInsideLongerText: the base64 of a text holding the
// secret (an HTTP basic credential, a dump) loses the characters made of
// the secret's bits, at any of the three offsets.
func TestString_EncodedInsideLongerText(t *testing.T) {
	s := New()
	s.Add(CHAPPassword, "correct-horse-battery")
	for k := range 3 {
		plain := strings.Repeat("x", k) + "correct-horse-battery" + "-tail"
		enc := base64.StdEncoding.EncodeToString([]byte(plain))
		got := s.String(enc)
		if got == enc {
			t.Errorf("offset %d: %q unchanged", k, enc)
		}
		// What is left decodes to nothing that holds more than three
		// bytes of the secret in a row.
		for _, part := range strings.Split(got, Replacement) {
			if len(part) >= 8 && strings.Contains(base64.StdEncoding.EncodeToString([]byte("correct-horse-battery")), part) {
				t.Errorf("offset %d: %q of the encoding stays", k, part)
			}
		}
	}
}

func TestString_ShortValuesAreReplacedAsWholeWords(t *testing.T) {
	s := New()
	s.Add(CHAPUser, "ab")
	s.Add(CHAPPassword, "x")
	for in, want := range map[string]string{
		"user ab logged in":      "user *** logged in",
		"tab label abc":          "tab label abc",
		"password=x, lun=1":      "password=***, lun=1",
		"max x-ray":              "max ***-ray",
		"ab":                     "***",
		"nothing to see in here": "nothing to see in here",
	} {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestString_LearnsNodeRecordsAndKeys: a node record read back and a
// DH-HMAC-CHAP key in any text are scrubbed, and every later text in
// every spelling, though the set was never given them.
func TestString_LearnsNodeRecordsAndKeys(t *testing.T) {
	s := New()
	record := `# BEGIN RECORD 2.1.9
node.name = iqn.2024-01.io.example:t
node.session.auth.authmethod = CHAP
node.session.auth.username = record-user-7
node.session.auth.password = record-pass-7 with space
node.session.auth.username_in = <empty>
node.session.auth.password_in = ********
# END RECORD`
	got := s.String(record)
	for _, v := range []string{"record-user-7", "record-pass-7 with space", "record-pass-7"} {
		if strings.Contains(got, v) {
			t.Errorf("the record's %q is still in\n%s", v, got)
		}
	}
	for _, keep := range []string{"node.session.auth.authmethod = CHAP", "node.name = iqn.2024-01.io.example:t", "password_in = ********", "username_in = <empty>"} {
		if !strings.Contains(got, keep) {
			t.Errorf("%q was scrubbed from\n%s", keep, got)
		}
	}
	later := "login to the portal as " + base64.StdEncoding.EncodeToString([]byte("record-pass-7 with space"))
	leaks(t, s.String(later), "record-pass-7 with space")

	kernel := "nvme nvme3: qid 0: authentication failed, dhchap_secret=" + dhchap + ",dhchap_ctrl_secret=none"
	got = s.String(kernel)
	if strings.Contains(got, "ia6zGodOr4SEG0Zz") {
		t.Errorf("the key is still in %q", got)
	}
	leaks(t, s.String("again: "+hex.EncodeToString([]byte(dhchap))), dhchap)
}

func TestFind_RefusesPasswordsNotUserNames(t *testing.T) {
	s := New()
	s.Add(CHAPUser, "iqn.2024-01.io.example:initiator")
	s.Add(CHAPPassword, "pass-0042-word")
	if k, ok := s.Find([]byte(`{"iqn":"iqn.2024-01.io.example:initiator"}`)); ok {
		t.Errorf("a user name refused a file (%s)", k)
	}
	if k, ok := s.Find([]byte(`{"path":"/x/pass-0042-word/y"}`)); !ok || k != CHAPPassword {
		t.Errorf("Find = %q, %t; want the CHAP password", k, ok)
	}
	if _, ok := New().Find([]byte("dhchap " + dhchap)); !ok {
		t.Error("a DH-HMAC-CHAP key in a file is not found")
	}
}

func TestWriter_ScrubsEachWrite(t *testing.T) {
	s := New()
	s.Add(CHAPPassword, password)
	var b bytes.Buffer
	w := s.Writer(&b)
	line := []byte("E1 x.go:1] \"Login failed\" err=" + strconv.Quote("out: "+password) + "\n")
	n, err := w.Write(line)
	if err != nil || n != len(line) {
		t.Fatalf("Write = %d, %v; want %d", n, err, len(line))
	}
	leaks(t, b.String(), password)
}

func TestSet_ForgetsTheOldestPastItsBound(t *testing.T) {
	s := New()
	for i := range MaxValues + 3 {
		s.Add(RequestSecret, fmt.Sprintf("value-%06d", i))
	}
	if n := s.Values(); n != MaxValues {
		t.Fatalf("%d values, want %d", n, MaxValues)
	}
	if got := s.String("value-000000"); got != "value-000000" {
		t.Errorf("the oldest is still replaced: %q", got)
	}
	if got := s.String("value-" + fmt.Sprintf("%06d", MaxValues+2)); got != Replacement {
		t.Errorf("the newest is not replaced: %q", got)
	}
}

func TestSet_ConcurrentUse(t *testing.T) {
	s := New()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := range 200 {
				s.Add(RequestSecret, fmt.Sprintf("secret-%d-%d", i, j))
			}
		}()
		go func() {
			defer wg.Done()
			for j := range 200 {
				_ = s.String(fmt.Sprintf("line secret-%d-%d node.session.auth.password = p%d", i, j, j))
			}
		}()
	}
	wg.Wait()
}

// FuzzString: whatever the text, once a value is known no spelling of it
// survives, and text without any is returned unchanged.
func FuzzString(f *testing.F) {
	f.Add("pass-word-01", "a b pass-word-01 c")
	f.Add(`q"uote\slash`, `{"v":"q\"uote\\slash"}`)
	f.Fuzz(func(t *testing.T, value, text string) {
		if len(value) < minSubstring || strings.Contains(value, "***") || strings.ContainsAny(value, "*") {
			return
		}
		s := New()
		s.Add(CHAPPassword, value)
		got := s.String(text + " " + value + " " + strconv.Quote(value))
		if strings.Contains(got, value) {
			t.Fatalf("value %q survives in %q", value, got)
		}
	})
}
