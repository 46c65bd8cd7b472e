//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/flakyproxy"
	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Companion mode on the real kernel. "The other driver" is the test
// itself, attaching the way such drivers do: nvme-cli `connect` with its
// own host identity and tunables, `iscsiadm` logins, a file system made
// and mounted by hand. pathmend runs as `pathmend companion` beside it,
// with no CSI socket and no record of these volumes.

// The other driver's NVMe host identity and tunables: not the lab's
// /etc/nvme ones, and a short ctrl_loss_tmo (4 s at 1 s reconnect_delay)
// so the kernel gives a controller up quickly.
const (
	driverHostNQN = "nqn.2014-08.org.nvmexpress:uuid:d0d0d0d0-0000-4000-8000-0000000000d1"
	driverHostID  = "d0d0d0d0-0000-4000-8000-0000000000d1"
)

// driverConnect connects nqn through 127.0.0.1:svc with nvme-cli and the
// driver's options, and waits until the controller is live.
func driverConnect(t *testing.T, l lab, fsys sysfs.FS, nqn, svc string) string {
	t.Helper()
	l.sh(t, fmt.Sprintf("nvme connect -t tcp -a 127.0.0.1 -s %s -n %q -q %q -I %q -l 4 -c 1 -k 7 -i 1 -Q 64 >/dev/null",
		svc, nqn, driverHostNQN, driverHostID))
	var c string
	eventually(t, time.Minute, "the driver's controller to port "+svc+" live", func() bool {
		c = ctrlTo(fsys, nqn, svc)
		return c != "" && attrIs(fsys, "class/nvme/"+c+"/state", "live")()
	})
	return c
}

// ctrlTo is the live controller of nqn whose address has trsvcid svc,
// "" if there is none.
func ctrlTo(fsys sysfs.FS, nqn, svc string) string {
	names, _ := fsys.ReadDir("class/nvme")
	for _, n := range names {
		if v, err := fsys.ReadAttr("class/nvme/" + n + "/subsysnqn"); err != nil || v != nqn {
			continue
		}
		if strings.Contains(liveAddress(fsys, n), "trsvcid="+svc) {
			return n
		}
	}
	return ""
}

// companionProc is one `pathmend companion` process.
type companionProc struct {
	logPath string
	stop    func()
}

// startCompanion runs `pathmend companion` with its state dir in dir
// (kept across starts: a second process is pathmend restarted) and its
// log in the first free dir/companion[-N].log, 1 s ticks, and waits for
// its first tick. It is stopped in t.Cleanup at the latest.
func startCompanion(t *testing.T, l lab, dir string, extra ...string) *companionProc {
	t.Helper()
	logPath := filepath.Join(dir, "companion.log")
	for n := 2; fileExists(logPath); n++ {
		logPath = filepath.Join(dir, fmt.Sprintf("companion-%d.log", n))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"companion", "--sys-root", "/sys", "--dev-root", "/dev", "--state-dir", filepath.Join(dir, "state"),
		"--monitor-interval=1s", "-v=4"}, extra...)
	cmd := exec.Command(l.bin("pathmend"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("pathmend companion did not stop within 2 min of SIGINT")
			}
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("pathmend companion log %s:\n%s", filepath.Base(logPath), b)
			}
		})
	}
	t.Cleanup(stop)
	p := &companionProc{logPath: logPath, stop: stop}
	eventually(t, 4*time.Minute, "pathmend companion to start", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("pathmend companion exited early:\n%s", b)
		default:
		}
		return strings.Contains(p.log(t), "Companion mode started")
	})
	return p
}

func (p *companionProc) log(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lines returns the log lines holding every one of subs.
func (p *companionProc) lines(t *testing.T, subs ...string) []string {
	t.Helper()
	var out []string
next:
	for _, line := range strings.Split(p.log(t), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// learned returns the endpoints companion mode keeps on disk for nqn.
func learned(t *testing.T, dir, nqn string) []companion.Endpoint {
	t.Helper()
	s, ok, err := companion.OpenStore(filepath.Join(dir, "state"))
	if err != nil || !ok {
		return nil
	}
	subs, _, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	return subs[nqn].Endpoints
}

// waitLearned waits until both ports of nqn are learned live.
func waitLearned(t *testing.T, dir, nqn string) {
	t.Helper()
	eventually(t, time.Minute, "companion mode to learn both endpoints", func() bool {
		eps := learned(t, dir, nqn)
		return len(eps) == 2 && eps[0].LastState == nvme.StateLive && eps[1].LastState == nvme.StateLive
	})
}

// giveUpPort2 unlinks port 2 from nqn on the target and waits until the
// kernel deleted its controller (ctrl_loss_tmo ran out).
func giveUpPort2(t *testing.T, l lab, fsys sysfs.FS, nqn string) {
	t.Helper()
	lost := ctrlTo(fsys, nqn, "4421")
	if lost == "" {
		t.Fatal("no controller to port 4421")
	}
	l.sh(t, fmt.Sprintf("nvmet_port_unlink 2 %q", nqn))
	eventually(t, 2*time.Minute, "the kernel to delete "+lost+" after its ctrl_loss_tmo", func() bool {
		_, err := fsys.Stat("class/nvme/" + lost)
		return sysfs.IsNotExist(err)
	})
}

// checkDriversOptions fails the test unless controller c carries the
// options the driver connected with.
func checkDriversOptions(t *testing.T, fsys sysfs.FS, c string) {
	t.Helper()
	for attr, want := range map[string]string{
		"hostnqn": driverHostNQN, "hostid": driverHostID, "ctrl_loss_tmo": "4", "reconnect_delay": "1",
		"kato": "7", "queue_count": "2", "sqsize": "63",
	} {
		if got, err := fsys.ReadAttr("class/nvme/" + c + "/" + attr); err != nil || got != want {
			t.Errorf("%s/%s = %q (%v), want the driver's %q", c, attr, got, err, want)
		}
	}
}

// (a) One port kept away past the driver's short ctrl_loss_tmo: the
// kernel deletes its controller. When the port is back, companion mode
// connects it again with the learned options — the driver's host
// identity and timeouts — both paths are live and the file system on the
// namespace reads back what was written.
func TestCompanion_ReconnectsAGivenUpPathWithTheDriversOptions(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-companion-a"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	driverConnect(t, l, fsys, nqn, "4420")
	driverConnect(t, l, fsys, nqn, "4421")
	var head string
	eventually(t, time.Minute, "the namespace head with two legs", func() bool {
		h, legs, ok := headOf(t, nqn, 1)
		head = h
		return ok && len(legs) == 2
	})
	mnt := t.TempDir()
	unmountOnCleanup(t, mnt)
	pattern := bytes.Repeat([]byte("written-by-the-other-driver-"), 4096)
	l.sh(t, fmt.Sprintf("mkfs.ext4 -q -F /dev/%s && mount /dev/%s %s", head, head, mnt))
	if err := os.WriteFile(filepath.Join(mnt, "pattern"), pattern, 0o600); err != nil {
		t.Fatal(err)
	}
	l.sh(t, "sync")

	dir := t.TempDir()
	p := startCompanion(t, l, dir, "--heal=repair", "--nvme-reconnect")
	waitLearned(t, dir, nqn)
	giveUpPort2(t, l, fsys, nqn)
	eventually(t, time.Minute, "the give-up in companion mode's log", func() bool {
		return len(p.lines(t, "Learned NVMe endpoint changed", `event="given up by the kernel"`, "127.0.0.1:4421")) > 0
	})
	restored := time.Now()
	l.sh(t, fmt.Sprintf("nvmet_port_link 2 %q", nqn))
	var back string
	eventually(t, 3*time.Minute, "companion mode to reconnect port 4421", func() bool {
		back = ctrlTo(fsys, nqn, "4421")
		return back != "" && attrIs(fsys, "class/nvme/"+back+"/state", "live")()
	})
	t.Logf("port 4421 live again as %s, %s after the port returned", back, time.Since(restored).Round(100*time.Millisecond))
	eventually(t, time.Minute, "companion mode's \"Reconnected path\" line", func() bool {
		return len(p.lines(t, "Reconnected path", "learned=true", "127.0.0.1:4421")) > 0
	})
	checkDriversOptions(t, fsys, back)
	eventually(t, time.Minute, "both legs of the head again", func() bool {
		h, legs, ok := headOf(t, nqn, 1)
		return ok && h == head && len(legs) == 2
	})
	l.sh(t, "sync; echo 3 > /proc/sys/vm/drop_caches")
	if got, err := os.ReadFile(filepath.Join(mnt, "pattern")); err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("pattern after the give-up and reconnect: %d bytes, %v", len(got), err)
	}
	l.sh(t, "umount "+mnt)
}

// (b) The same with pathmend restarted between learning the endpoints
// and the give-up: what it learned is on disk, the restarted process
// sees the controller reconnecting, then gone, and connects it again with
// the driver's options.
func TestCompanion_ReconnectsAfterARestartBetweenLearningAndTheGiveUp(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-companion-b"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	driverConnect(t, l, fsys, nqn, "4420")
	driverConnect(t, l, fsys, nqn, "4421")
	dir := t.TempDir()
	first := startCompanion(t, l, dir, "--heal=repair", "--nvme-reconnect")
	waitLearned(t, dir, nqn)
	first.stop()
	second := startCompanion(t, l, dir, "--heal=repair", "--nvme-reconnect")
	if !strings.Contains(second.log(t), "learned=1") {
		t.Errorf("the restarted companion does not start from what was learned:\n%s", second.log(t))
	}
	giveUpPort2(t, l, fsys, nqn)
	l.sh(t, fmt.Sprintf("nvmet_port_link 2 %q", nqn))
	var back string
	eventually(t, 3*time.Minute, "the restarted companion to reconnect port 4421", func() bool {
		back = ctrlTo(fsys, nqn, "4421")
		return back != "" && attrIs(fsys, "class/nvme/"+back+"/state", "live")()
	})
	checkDriversOptions(t, fsys, back)
	eventually(t, time.Minute, "the restarted companion's \"Reconnected path\" line", func() bool {
		return len(second.lines(t, "Reconnected path", "learned=true", "127.0.0.1:4421")) > 0
	})
}

// (c) The driver disconnects a live controller (`nvme disconnect`, as its
// NodeUnstage would): companion mode forgets the endpoint and never
// connects it again.
func TestCompanion_DoesNotReconnectWhatTheDriverDisconnected(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-companion-c"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	driverConnect(t, l, fsys, nqn, "4420")
	c2 := driverConnect(t, l, fsys, nqn, "4421")
	dir := t.TempDir()
	p := startCompanion(t, l, dir, "--heal=repair", "--nvme-reconnect", "--nvme-repairs")
	waitLearned(t, dir, nqn)
	l.sh(t, "nvme disconnect -d "+c2+" >/dev/null")
	eventually(t, time.Minute, "companion mode to forget the endpoint", func() bool {
		return len(p.lines(t, `event="disconnected"`, "127.0.0.1:4421")) > 0
	})
	waitTicks(t, p.logPath, time.Now(), 6)
	if c := ctrlTo(fsys, nqn, "4421"); c != "" {
		t.Errorf("%s connects port 4421 again after the driver disconnected it", c)
	}
	p.stop()
	if lines := p.lines(t, "Reconnected path"); len(lines) > 0 {
		t.Errorf("companion mode reconnected:\n%s", strings.Join(lines, "\n"))
	}
	if eps := learned(t, dir, nqn); len(eps) != 1 || eps[0].Trsvcid != "4420" {
		t.Errorf("learned %+v, want only port 4420", eps)
	}
}

// foreignLogin logs in to iqn at portal as another driver does (a node
// record of its own, iscsiadm --login) and returns the session and the
// device a file system goes on: the LUN's multipath map when multipathd
// holds the disk, else the disk.
func foreignLogin(t *testing.T, l lab, sys sysfs.FS, iqn, portal string) (iscsi.Session, string) {
	t.Helper()
	l.sh(t, fmt.Sprintf("iscsiadm -m node -o new -T %q -p %s >/dev/null && iscsi_login %q %s >/dev/null", iqn, portal, iqn, portal))
	var s iscsi.Session
	eventually(t, 2*time.Minute, "the foreign session with its disk", func() bool {
		var ok bool
		s, ok = sessionTo(t, sys, iqn, portal)
		return ok && s.State.LoggedIn() && len(s.LUNs) == 1 && s.LUNs[0].Disk != ""
	})
	disk := s.LUNs[0].Disk
	dev := "/dev/" + disk
	eventually(t, time.Minute, "multipathd to map "+disk, func() bool {
		hs, _ := sys.ReadDir("block/" + disk + "/holders")
		if len(hs) == 1 {
			dev = "/dev/" + hs[0]
			return true
		}
		return false
	})
	return s, dev
}

// restartScript writes the iscsid restart the lab uses and returns the
// --iscsid-restart-command that runs it.
func restartScript(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "restart-iscsid.sh")
	if err := os.WriteFile(p, []byte(restartIscsid+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return "--iscsid-restart-command=bash " + p
}

// (d) The stuck session of open-iscsi #387 on a session another driver
// logged in, the last path of a mounted file system: companion mode in
// observe only says what it would do; restarted in repair mode with the
// iscsid restart enabled it restarts iscsid (never a logout: the LUN has
// no other path), the session is LOGGED_IN again and the file system
// reads back.
func TestCompanion_KicksAForeignStuckSessionBackToLoggedIn(t *testing.T) {
	l := needLab(t)
	proxy := startFlakyProxy(t, proxyPortal, "127.0.0.2:3260")
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-companion-d"
	lioTarget(t, l, iqn, "e2e-companion-d", "", "", "127.0.0.2")
	sys := sysfs.New("/sys")
	before, dev := foreignLogin(t, l, sys, iqn, proxyPortal)
	mnt := t.TempDir()
	unmountOnCleanup(t, mnt)
	l.sh(t, "mkfs.ext4 -q -F "+dev+" && mount "+dev+" "+mnt+" && echo other-driver >"+mnt+"/proof && sync")

	dir := t.TempDir()
	restart := restartScript(t, dir)
	obs := startCompanion(t, l, dir, "--heal=observe", "--iscsi-stuck-threshold=10s", restart)
	stuckOrFail(t, sys, proxy, iqn)
	eventually(t, 2*time.Minute, "an observed verdict for the stuck foreign session", func() bool {
		return len(obs.lines(t, `"iSCSI session verdict"`, `verdict="observed"`, proxyPortal)) > 0
	})
	obs.stop()
	if lines := append(obs.lines(t, "Kicking iSCSI session"), obs.lines(t, "Restarting iscsid")...); len(lines) > 0 {
		t.Errorf("observe mode kicked:\n%s", strings.Join(lines, "\n"))
	}
	// The choice comes from the node's view: the other driver's mount.
	for _, line := range obs.lines(t, `"iSCSI session verdict"`, `verdict="observed"`, proxyPortal) {
		if why := verdictField(line, "reason"); !strings.Contains(why, "would restart-iscsid") || !strings.Contains(why, "is in use on the node: ") || !strings.Contains(why, " is mounted at "+mnt) {
			t.Errorf("observed reason %q, want restart-iscsid for a LUN mounted at %s", why, mnt)
		}
	}

	repaired := repairForeignStuck(t, l, dir, sys, proxy, iqn, restart)
	t.Logf("repaired: %s", repaired)
	if k := verdictField(repaired, "kick"); k != string(iscsi.KickRestart) {
		t.Errorf("kick %q, want %s: the session is the last path of a mounted map", k, iscsi.KickRestart)
	}
	after, ok := sessionTo(t, sys, iqn, proxyPortal)
	if !ok || !after.State.LoggedIn() || after.ID != before.ID {
		t.Errorf("session after the heal: %+v, want %s LOGGED_IN", after, before.ID)
	}
	if got := l.sh(t, "cat "+mnt+"/proof"); got != "other-driver" {
		t.Errorf("file system content after the heal: %q", got)
	}
	l.sh(t, "umount "+mnt)
}

// repairForeignStuck starts companion mode in repair mode on the stuck
// session to iqn through the proxy and returns its repaired verdict line.
// The stuck state is a race iscsid can still win after the proxy called
// it (docs/iscsi.md, "Proven in the lab"): when the session is LOGGED_IN
// again before the companion kicked anything, iscsid relogged it in by
// itself and there is nothing to repair. That attempt is a retry (a
// finding, counted): the companion is stopped, the session driven stuck
// again, and a new companion started, at most three times. The session's
// state is logged at each change the test reads.
func repairForeignStuck(t *testing.T, l lab, dir string, sys sysfs.FS, proxy *flakyproxy.Proxy, iqn, restart string) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		rep := startCompanion(t, l, dir, "--heal=repair", "--iscsid-restart", "--iscsi-relogin", "--iscsi-stuck-threshold=10s", restart)
		var repaired, state string
		recovered := false
		eventually(t, 4*time.Minute, "a repaired verdict for the stuck foreign session, or iscsid relogging it in by itself", func() bool {
			s, ok := sessionTo(t, sys, iqn, proxyPortal)
			if now := fmt.Sprintf("%s %s (found: %t)", s.ID, s.State, ok); now != state {
				state = now
				t.Logf("session through %s: %s", proxyPortal, state)
			}
			if ls := rep.lines(t, `"iSCSI session verdict"`, `verdict="repaired"`, proxyPortal); len(ls) > 0 {
				repaired = ls[0]
				return true
			}
			// The kick lines are written before the kick runs: read
			// after the session, none means none ran before it was up.
			kicks := len(rep.lines(t, "Kicking iSCSI session")) + len(rep.lines(t, "Restarting iscsid"))
			recovered = ok && s.State.LoggedIn() && kicks == 0
			return recovered
		})
		if repaired != "" {
			return repaired
		}
		t.Logf("companion's lines on the session:\n%s", strings.Join(rep.lines(t, "iSCSI session"), "\n"))
		rep.stop()
		if attempt == 3 {
			t.Fatalf("iscsid relogged the stuck session in by itself %d times before the companion's threshold", attempt)
		}
		retried(t, fmt.Sprintf("attempt %d: iscsid relogged the stuck session in by itself before the repair companion kicked it; driven stuck again", attempt))
		stuckOrFail(t, sys, proxy, iqn)
	}
}

// (e) The portal of a foreign session truly unreachable (packets
// dropped): companion mode, with every iSCSI action enabled, refuses
// (portal_unreachable) and touches nothing; the session stays as it is.
func TestCompanion_LeavesAForeignSessionWithAnUnreachablePortalAlone(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-companion-e"
	lioTarget(t, l, iqn, "e2e-companion-e", "", "", "127.0.0.2")
	sys := sysfs.New("/sys")
	before, _ := foreignLogin(t, l, sys, iqn, "127.0.0.2:3260")
	dir := t.TempDir()
	p := startCompanion(t, l, dir, "--heal=repair", "--iscsid-restart", "--iscsi-relogin", "--iscsi-stuck-threshold=5s", restartScript(t, dir))
	t.Cleanup(func() { _, _ = l.trySh(t, 2*time.Minute, "fault_clear") })
	l.sh(t, "fault_drop_port 3260 127.0.0.2")
	eventually(t, 3*time.Minute, "the foreign session to leave LOGGED_IN", func() bool {
		s, ok := sessionTo(t, sys, iqn, "127.0.0.2:3260")
		return ok && !s.State.LoggedIn()
	})
	var refusal string
	eventually(t, 2*time.Minute, "a refused verdict with an unreachable portal", func() bool {
		for _, line := range p.lines(t, `"iSCSI session verdict"`, `verdict="refused"`, "127.0.0.2:3260") {
			if strings.Contains(verdictField(line, "reason"), "unreachable") {
				refusal = line
			}
		}
		return refusal != ""
	})
	t.Logf("refusal: %s", refusal)
	waitTicks(t, p.logPath, time.Now(), 10) // ten ticks more, still dropped
	p.stop()
	if ls := append(p.lines(t, "Kicking iSCSI session"), p.lines(t, "Restarting iscsid")...); len(ls) > 0 {
		t.Errorf("companion mode kicked a session whose portal is unreachable:\n%s", strings.Join(ls, "\n"))
	}
	still, ok := sessionTo(t, sys, iqn, "127.0.0.2:3260")
	if !ok || still.ID != before.ID || still.State.LoggedIn() {
		t.Errorf("session while dropped: %+v, want %s still down", still, before.ID)
	}
}
