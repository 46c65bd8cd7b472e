package attach

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// captureLogs sends klog output at verbosity v to a buffer for this test.
func captureLogs(t *testing.T, v string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false", "-v=" + v}); err != nil {
		t.Fatal(err)
	}
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(nil)
		_ = fs.Set("logtostderr", "true")
		_ = fs.Set("v", "0")
	})
	return &buf
}

var chap = volume.Secrets{CHAPUsername: "node-user", CHAPPassword: "chap-Secret-42", CHAPUsernameIn: "tgt-user", CHAPPasswordIn: "mutual-Secret-43"}

// Two portals with multipathd: both log in, the map over both disks is
// the device, the node records carry the volume's settings, and no CHAP
// secret reaches a log line.
func TestAttach_TwoPortalsGiveTheMultipathMap(t *testing.T) {
	logs := captureLogs(t, "5")
	h := newFakeHost(t)
	a := h.attacher(nil)
	rt := 30
	vc := iscsiVolume(0, "127.0.0.1", "127.0.0.2")
	vc.ISCSI.ReplacementTimeout = &rt
	dev, err := attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: vc, Secrets: chap})
	if err != nil {
		t.Fatal(err)
	}
	if want := (volume.Device{Path: filepath.Join(h.dev, "dm-0"), SizeBytes: 64 << 20, Number: volume.DeviceNumber{Major: 254, Minor: 0}}); dev != want {
		t.Errorf("device %+v, want %+v", dev, want)
	}
	wantSettings := map[string]string{
		"node.startup": "manual", "node.conn[0].timeo.login_timeout": "1", "node.session.initial_login_retry_max": "2",
		"node.session.timeo.replacement_timeout": "30", "node.session.auth.authmethod": "CHAP",
		"node.session.auth.username": "node-user", "node.session.auth.password": "chap-Secret-42",
		"node.session.auth.username_in": "tgt-user", "node.session.auth.password_in": "mutual-Secret-43",
	}
	for _, k := range []string{iqn + ",127.0.0.1:3260", iqn + ",127.0.0.2:3260"} {
		if diff := cmp.Diff(wantSettings, h.RecordSettings(k)); diff != "" {
			t.Errorf("record %s (-want +got):\n%s", k, diff)
		}
	}
	klog.Flush()
	for _, s := range []string{chap.CHAPPassword, chap.CHAPPasswordIn, chap.CHAPUsername, chap.CHAPUsernameIn} {
		if strings.Contains(logs.String(), s) {
			t.Fatalf("secret %q in the logs:\n%s", s, logs)
		}
	}
	// Attach is idempotent: logins answer "already present".
	again, err := attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: vc, Secrets: chap})
	if err != nil || again != dev {
		t.Fatalf("second attach: %+v, %v", again, err)
	}
	if n := h.SessionCount(); n != 2 {
		t.Errorf("%d sessions after two attaches", n)
	}
}

// multipathd with find_multipaths "no" maps a single path too: the map is
// the device, never the disk it claims.
func TestAttach_SinglePathMappedByMultipathdGivesTheMap(t *testing.T) {
	h := newFakeHost(t)
	h.MapSingle = true
	dev, err := attachDev(h.attacher(nil), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1")})
	if err != nil || dev.Path != filepath.Join(h.dev, "dm-0") {
		t.Fatalf("%+v, %v", dev, err)
	}
}

// Without multipathd: one portal gives its disk; two portals give the
// first portal's disk once the multipath wait is over; NoMultipathd does
// not wait at all.
func TestAttach_WithoutAMapUsesOneDisk(t *testing.T) {
	h := newFakeHost(t)
	h.Multipathd = false
	a := h.attacher(nil)
	dev, err := attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1")})
	if err != nil || dev.Path != filepath.Join(h.dev, "sda") {
		t.Fatalf("one portal: %+v, %v", dev, err)
	}
	dev, err = attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1", "127.0.0.2")})
	if err != nil || dev.Path != filepath.Join(h.dev, "sda") {
		t.Fatalf("two portals, no map: %+v, %v", dev, err)
	}
	noWait := h.attacher(func(c *AttacherConfig) { c.NoMultipathd = true; c.MultipathWait = time.Hour })
	start := time.Now()
	if dev, err := attachDev(noWait, volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1")}); err != nil || dev.Path != filepath.Join(h.dev, "sda") {
		t.Fatalf("NoMultipathd: %+v, %v", dev, err)
	}
	if time.Since(start) > time.Minute {
		t.Error("NoMultipathd waited for a map")
	}
}

// A portal that does not log in leaves the volume attached through the
// others; the session heal retries it later.
func TestAttach_OnePortalFailingStillAttaches(t *testing.T) {
	h := newFakeHost(t)
	h.LoginCode["127.0.0.2:3260"] = int(iscsi.ExitTransportTimeout)
	a := h.attacher(nil)
	dev, err := attachDev(a, volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1", "127.0.0.2")})
	if err != nil || dev.Path != filepath.Join(h.dev, "sda") {
		t.Fatalf("%+v, %v", dev, err)
	}
}

// When nothing logs in, or the disks are not one LUN (WWIDs published but
// different or missing on some paths, sizes different, the map of another
// size or holding a foreign disk), Attach fails naming what it created,
// and Undo removes exactly that: sessions and node records.
func TestAttach_FailureRollsBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*fakeHost)
		want  string
		is    error
	}{
		{"login rejected everywhere", func(h *fakeHost) {
			h.LoginCode["127.0.0.1:3260"] = int(iscsi.ExitLoginAuthFailed)
			h.LoginCode["127.0.0.2:3260"] = int(iscsi.ExitLoginAuthFailed)
		}, "no portal of " + iqn + " logged in", iscsi.ErrAuthFailed},
		{"paths disagree on identity", func(h *fakeHost) {
			h.WWID = func(portal string, _ int) string { return "naa.6001405" + strings.ReplaceAll(portal, ".", "") }
		}, "disagree on identity", nil},
		{"wwid on one path only", func(h *fakeHost) {
			h.WWID = func(portal string, _ int) string {
				if portal == "127.0.0.2:3260" {
					return ""
				}
				return "naa.6001405aaaa"
			}
		}, "cannot verify session2 (127.0.0.2:3260) sdb: the kernel publishes no WWID for it, while session1 (127.0.0.1:3260) sda has naa.6001405aaaa", nil},
		{"paths disagree on size", func(h *fakeHost) {
			h.Sectors = func(portal string, _ int) int64 { return map[string]int64{"127.0.0.2:3260": 262144}[portal] }
		}, "disagree on size", nil},
		{"map size differs from the paths", func(h *fakeHost) { h.MapSectors = 262144 },
			"multipath map dm-0 (mpatha) of " + iqn + " LUN 0 has 134217728 bytes, its path sda has 67108864", nil},
		{"no wwid anywhere, map size differs from the paths", func(h *fakeHost) {
			h.WWID = func(string, int) string { return "" }
			h.MapSectors = 262144
		}, "multipath map dm-0 (mpatha) of " + iqn + " LUN 0 has 134217728 bytes, its path sda has 67108864", nil},
		{"map holds another LUN's disk", func(h *fakeHost) {
			h.LUNs = []int{0, 1}
			h.MapExtra = map[int][]string{0: {"sdd"}}
		}, "multipath map dm-0 (mpatha) holds sdd, which is not a path of LUN naa.6001405", nil},
		{"no wwid anywhere, map holds another LUN's disk", func(h *fakeHost) {
			h.WWID = func(string, int) string { return "" }
			h.LUNs = []int{0, 1}
			h.MapExtra = map[int][]string{0: {"sdd"}}
		}, "multipath map dm-0 (mpatha) holds sdd, which is not a path of LUN 0 of " + iqn + " (no WWID)", nil},
		{"no disk appears", func(h *fakeHost) { h.NoDisk = true }, "no disk on 2 logged-in session(s)", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			tc.setup(h)
			a := h.attacher(nil)
			att, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1", "127.0.0.2"), Secrets: chap})
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), chap.CHAPPassword) {
				t.Fatalf("secret in the error: %v", err)
			}
			if err := a.Undo(context.Background(), att, volume.CoTenants{}); err != nil {
				t.Fatalf("Undo: %v", err)
			}
			if n, keys := h.SessionCount(), h.RecordKeys(); n != 0 || len(keys) != 0 {
				t.Errorf("left behind: %d sessions, records %v", n, keys)
			}
		})
	}
}

// A LUN for which the kernel publishes no WWID on any path (no wwid
// attribute and no vpd_pg83 page) attaches, verified by size only, and
// says so in one log line; with WWIDs there is no such line.
func TestAttach_WithoutAWWIDVerifiesBySizeOnly(t *testing.T) {
	const line = "Cannot verify the LUN's WWID; verifying the device by size only"
	for _, tc := range []struct {
		name       string
		portals    []string
		multipathd bool
		noWWID     bool
		want       string
		number     volume.DeviceNumber
		lines      int
	}{
		{"two portals, map", []string{"127.0.0.1", "127.0.0.2"}, true, true, "dm-0", volume.DeviceNumber{Major: 254}, 1},
		{"two portals, no map", []string{"127.0.0.1", "127.0.0.2"}, false, true, "sda", volume.DeviceNumber{Major: 8}, 1},
		{"one portal, no map", []string{"127.0.0.1"}, false, true, "sda", volume.DeviceNumber{Major: 8}, 1},
		{"wwids published", []string{"127.0.0.1", "127.0.0.2"}, true, false, "dm-0", volume.DeviceNumber{Major: 254}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := captureLogs(t, "0")
			h := newFakeHost(t)
			h.Multipathd = tc.multipathd
			if tc.noWWID {
				h.WWID = func(string, int) string { return "" }
			}
			dev, err := attachDev(h.attacher(nil), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, tc.portals...)})
			if err != nil {
				t.Fatal(err)
			}
			if want := (volume.Device{Path: filepath.Join(h.dev, tc.want), SizeBytes: 64 << 20, Number: tc.number}); dev != want {
				t.Errorf("device %+v, want %+v", dev, want)
			}
			klog.Flush()
			if n := strings.Count(logs.String(), line); n != tc.lines {
				t.Fatalf("%d lines %q, want %d:\n%s", n, line, tc.lines, logs)
			}
			if tc.lines > 0 && !strings.Contains(logs.String(), "no WWID for the LUN on any path") {
				t.Errorf("the line does not say why:\n%s", logs)
			}
		})
	}
}

// A LUN missing on a logged-in session is scanned, exactly that LUN.
func TestAttach_ScansExactlyTheMissingLUN(t *testing.T) {
	h := newFakeHost(t)
	h.NoDisk = true
	h.LUNs = []int{}
	a := h.attacher(func(c *AttacherConfig) { c.DeviceTimeout = scanAfter + 300*time.Millisecond })
	_, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(7, "127.0.0.1")})
	if err == nil {
		t.Fatal("attach without a disk succeeded")
	}
	if got := readWO(t, h.sys, "devices/platform/host11/scsi_host/host11/scan"); got != "0 0 7" {
		t.Errorf("scan wrote %q, want \"0 0 7\"", got)
	}
}

// sendtargets discovery creates the records; a portal the target does not
// report is an error.
func TestAttach_SendTargetsDiscovery(t *testing.T) {
	h := newFakeHost(t)
	a := h.attacher(func(c *AttacherConfig) { c.Discovery = DiscoverySendTargets })
	if _, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1", "127.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	discovered := 0
	for _, l := range h.exec.Lines() {
		if strings.Contains(l, "-m discovery -t sendtargets -p 127.0.0.1:3260") {
			discovered++
		}
		if strings.Contains(l, "-o new") && !strings.Contains(l, "discovery") {
			t.Errorf("static record created in discovery mode: %s", l)
		}
	}
	if discovered != 1 {
		t.Errorf("discovery ran %d times", discovered)
	}
	h2 := newFakeHost(t)
	h2.Portals = []string{"127.0.0.1:3260"}
	_, err := h2.attacher(func(c *AttacherConfig) { c.Discovery = DiscoverySendTargets }).
		Attach(context.Background(), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(0, "127.0.0.1", "127.0.0.2")})
	if err == nil || !strings.Contains(err.Error(), "did not report portal 127.0.0.2:3260") {
		t.Fatalf("unreported portal: %v", err)
	}
}

func TestNewAttacher_Validates(t *testing.T) {
	h := newFakeHost(t)
	ok := AttacherConfig{Sys: sysfs.New(h.sys), DevRoot: h.dev, Initiator: h.in, NodeLoginTimeout: time.Second}
	for name, mod := range map[string]func(*AttacherConfig){
		"sysfs":     func(c *AttacherConfig) { c.Sys = sysfs.FS{} },
		"dev":       func(c *AttacherConfig) { c.DevRoot = "" },
		"initiator": func(c *AttacherConfig) { c.Initiator = nil },
		"discovery": func(c *AttacherConfig) { c.Discovery = "isns" },
		"fraction":  func(c *AttacherConfig) { c.NodeLoginTimeout = 1500 * time.Millisecond },
		// iscsid could still be retrying when the login command gives up.
		"budget": func(c *AttacherConfig) { c.NodeLoginTimeout = 10 * time.Second; c.NodeLoginRetries = 3 },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := NewAttacher(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewAttacher(ok); err != nil {
		t.Errorf("valid config: %v", err)
	}
}
