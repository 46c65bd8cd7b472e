//go:build e2e

package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
)

// verdictField returns the value of key="…" in a log line, "" if absent.
func verdictField(line, key string) string {
	m := regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `="((?:[^"\\]|\\.)*)"`).FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	return m[1]
}

// The heal as it runs on a node, end to end through `pathmend serve`: a
// two-portal volume (127.0.0.1 and the flaky proxy in front of 127.0.0.2)
// is staged, published and written through the CSI socket by a pathmend
// in observe mode. The proxied session is driven into the stuck state of
// open-iscsi #387; pathmend only reports what it would do. pathmend is
// then restarted with heal=repair and the default scope (staged): it finds
// the volume in its records on disk and the session's state in sysfs,
// starts its clocks at its first look, and after the threshold logs the
// session out and in. The other path is never touched, the map gets its
// second path back, the volume reports healthy and the pattern reads back.
func TestISCSI_ServedHealKicksAStuckSessionOfAStagedVolume(t *testing.T) {
	l := needLab(t)
	proxy := startFlakyProxy(t, proxyPortal, "127.0.0.2:3260")
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-served-heal"
	const id = "vol-e2e-served-heal"
	v := stageServedISCSIOn(t, l, iqn, "e2e-served-heal", []string{noActionPortalA, proxyPortal},
		"--heal=observe", "--iscsi-stuck-threshold=10s")
	other := v.session(t, noActionPortalA)
	stuck := v.session(t, proxyPortal)

	stuckOrFail(t, v.sys, proxy, iqn)
	if s := v.session(t, proxyPortal); s.ID != stuck.ID {
		t.Fatalf("the stuck session is %s, staged as %s: something logged it out", s.ID, stuck.ID)
	}
	if hs := volumeHealth(t, v.node, id); len(hs) == 0 {
		t.Errorf("volume health while a path is stuck: healthy, want degraded")
	} else {
		t.Logf("volume health while stuck: %s %s", hs[0].GetStatus(), hs[0].GetMessage())
	}
	// The observed verdict comes once the session has been down for the
	// 10s threshold on pathmend's clock, which may be after the stuck
	// state was established: an attempt ends as soon as it is decided.
	var verdicts []string
	var observed string
	eventually(t, 2*time.Minute, "an observed verdict for the stuck session", func() bool {
		verdicts, _ = v.verdictLines(t)
		for _, line := range verdicts {
			if verdictField(line, "verdict") == "observed" && verdictField(line, "portal") == proxyPortal {
				observed = line
			}
		}
		return observed != ""
	})
	if verdictField(observed, "kick") != string(iscsi.KickRelogin) {
		t.Errorf("observe mode: no observed logout-login verdict for %s in:\n%s", proxyPortal, strings.Join(verdicts, "\n"))
	}
	if b, err := os.ReadFile(v.logPath); err != nil || strings.Contains(string(b), "Kicking iSCSI session") {
		t.Errorf("pathmend kicked in observe mode (or its log is unreadable: %v)", err)
	}

	v.restart(t, l, "--heal=repair", "--iscsi-stuck-threshold=10s")
	restarted := time.Now()
	var repaired string
	eventually(t, 4*time.Minute, "a repaired verdict for the stuck session", func() bool {
		verdicts, _ := v.verdictLines(t)
		for _, line := range verdicts {
			if verdictField(line, "verdict") == "repaired" && verdictField(line, "portal") == proxyPortal {
				repaired = line
				return true
			}
		}
		return false
	})
	t.Logf("repaired %s after pathmend restarted: %s", time.Since(restarted).Round(100*time.Millisecond), repaired)
	if k := verdictField(repaired, "kick"); k != string(iscsi.KickRelogin) {
		t.Errorf("kick %q, want %s: the map has another live path", k, iscsi.KickRelogin)
	}
	if s := verdictField(repaired, "session"); s != stuck.ID.String() {
		t.Errorf("repaired session %s, want %s", s, stuck.ID)
	}
	// On pathmend's own clock (its clocks start at its first look, one
	// tick after it started): the portal was reachable for the threshold
	// when it kicked.
	if d, err := time.ParseDuration(verdictField(repaired, "reachableFor")); err != nil || d < 10*time.Second {
		t.Errorf("kicked with the portal reachable for %q, want at least the 10s threshold", verdictField(repaired, "reachableFor"))
	}
	// The kick came at the first tick or two after the threshold ran out:
	// downFor is the session's time down when the kick was decided, so
	// the threshold ran out downFor − 10s before the kick's line. Counted
	// in pathmend's ticks, which a loaded guest runs late, not more of;
	// a kick that waited for anything else (a cooldown, a second
	// threshold) comes many ticks later.
	downFor, err := time.ParseDuration(verdictField(repaired, "downFor"))
	if err != nil || downFor < 10*time.Second {
		t.Fatalf("repaired with downFor %q, want at least the 10s threshold", verdictField(repaired, "downFor"))
	}
	lines := readLog(t, v.logPath)
	var kick logLine
	for _, x := range withMsg(lines, "Kicking iSCSI session") {
		if x.KV["session"] == stuck.ID.String() {
			kick = x
		}
	}
	if kick.Raw == "" {
		t.Fatalf("no \"Kicking iSCSI session\" line for %s before its repaired verdict", stuck.ID)
	}
	if n := ticksBetween(lines, logAt(kick).Add(-(downFor - 10*time.Second)), logAt(kick)); n > 2 {
		t.Errorf("kicked %d monitor ticks after the session had been down the 10s threshold (downFor %s), want within 2", n, downFor)
	}
	back := v.session(t, proxyPortal)
	if !back.State.LoggedIn() || back.ID == stuck.ID {
		t.Errorf("session through %s after the heal: %s %s, want a new session LOGGED_IN", proxyPortal, back.ID, back.State)
	}
	if s := v.session(t, noActionPortalA); s.ID != other.ID || !s.State.LoggedIn() {
		t.Errorf("the other path: %s %s, want %s LOGGED_IN untouched", s.ID, s.State, other.ID)
	}
	eventually(t, 3*time.Minute, "the volume healthy (both paths in its map)", func() bool {
		return len(volumeHealth(t, v.node, id)) == 0
	})
	v.readBack(t, l)
}
