//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// nvmeTwoPortTarget builds subsystem nqn with one namespace behind port 1
// (127.0.0.1:4420, ANA optimized) and port 2 (127.0.0.1:4421,
// non-optimized), and loads the host side (nvme_tcp, which brings
// /dev/nvme-fabrics).
func nvmeTwoPortTarget(t *testing.T, l lab, nqn string) {
	t.Helper()
	l.sh(t, fmt.Sprintf(`
modprobe nvme_tcp
nqn=%q
dev=$(lab_loop_create e2e-nvme 64)
nvmet_subsys_create "$nqn"
nvmet_ns_add "$nqn" 1 "$dev" 1 "$(lab_uuid_of "$nqn/1")"
nvmet_port_create 1 127.0.0.1 4420
nvmet_port_create 2 127.0.0.1 4421
nvmet_port_ana 1 1 optimized
nvmet_port_ana 2 1 non-optimized
nvmet_port_link 1 "$nqn"
nvmet_port_link 2 "$nqn"
`, nqn))
}

var fabricsAnswer = regexp.MustCompile(`^instance=(\d+),cntlid=(\d+)`)

// fabricsConnect connects the way pathmend does: one write of the option
// string to /dev/nvme-fabrics, then a read of the answer from the same
// open file. It returns the controller name (nvmeN).
func fabricsConnect(t *testing.T, nqn, addr, svc string) string {
	t.Helper()
	hostnqn, err := os.ReadFile("/etc/nvme/hostnqn")
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("transport=tcp,traddr=%s,trsvcid=%s,nqn=%s,hostnqn=%s,reconnect_delay=2,ctrl_loss_tmo=60",
		addr, svc, nqn, strings.TrimSpace(string(hostnqn)))
	f, err := os.OpenFile("/dev/nvme-fabrics", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(opts)); err != nil {
		t.Fatalf("connect %s at %s:%s: %v", nqn, addr, svc, err)
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil {
		t.Fatalf("read /dev/nvme-fabrics answer: %v", err)
	}
	m := fabricsAnswer.FindStringSubmatch(string(buf[:n]))
	if m == nil {
		t.Fatalf("unexpected /dev/nvme-fabrics answer %q", buf[:n])
	}
	return "nvme" + m[1]
}

// connectTwoPorts connects nqn through both ports of nvmeTwoPortTarget
// and waits until both controllers are live.
func connectTwoPorts(t *testing.T, fsys sysfs.FS, nqn string) (c1, c2 string) {
	t.Helper()
	c1 = fabricsConnect(t, nqn, "127.0.0.1", "4420")
	c2 = fabricsConnect(t, nqn, "127.0.0.1", "4421")
	for _, c := range []string{c1, c2} {
		eventually(t, time.Minute, c+" live", attrIs(fsys, "class/nvme/"+c+"/state", "live"))
	}
	return c1, c2
}

func attrIs(fsys sysfs.FS, rel, want string) func() bool {
	return func() bool {
		v, err := fsys.ReadAttr(rel)
		return err == nil && v == want
	}
}

func TestNVMeTCP_TwoPortsGiveOneHeadWithOptimizedAndNonOptimizedLegs(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-two-ports"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")

	c1, c2 := connectTwoPorts(t, fsys, nqn)
	for _, c := range []string{c1, c2} {
		if got, err := fsys.ReadAttr("class/nvme/" + c + "/subsysnqn"); err != nil || got != nqn {
			t.Fatalf("%s subsysnqn = %q, %v; want %q", c, got, err, nqn)
		}
	}
	if mp, err := fsys.ReadAttr("module/nvme_core/parameters/multipath"); err != nil || mp != "Y" {
		t.Fatalf("nvme_core multipath = %q, %v; want Y", mp, err)
	}
	if addr := liveAddress(fsys, c2); !strings.HasPrefix(addr, "traddr=127.0.0.1,trsvcid=4421") {
		t.Fatalf("%s live address = %q", c2, addr)
	}

	// Both controllers sit in one subsystem with one head nvmeSn1 and a
	// hidden leg nvmeScCn1 per controller.
	sub := subsystemOf(t, fsys, c1)
	if got := subsystemOf(t, fsys, c2); got != sub {
		t.Fatalf("%s in %s, %s in %s: want one subsystem", c1, sub, c2, got)
	}
	s := strings.TrimPrefix(sub, "nvme-subsys")
	head := "nvme" + s + "n1"
	eventually(t, time.Minute, "head "+head, func() bool {
		_, err := fsys.Stat("class/nvme-subsystem/" + sub + "/" + head)
		return err == nil
	})
	leg := func(c string) string {
		return "class/nvme/" + c + "/nvme" + s + "c" + strings.TrimPrefix(c, "nvme") + "n1"
	}
	eventually(t, time.Minute, "optimized leg via "+c1, attrIs(fsys, leg(c1)+"/ana_state", "optimized"))
	eventually(t, time.Minute, "non-optimized leg via "+c2, attrIs(fsys, leg(c2)+"/ana_state", "non-optimized"))

	// An ANA change on the target shows in the leg.
	l.sh(t, "nvmet_port_ana 2 1 inaccessible")
	eventually(t, time.Minute, "inaccessible leg via "+c2, attrIs(fsys, leg(c2)+"/ana_state", "inaccessible"))

	// nvme-cli as an oracle only: it sees the same two paths.
	out, err := exec.Command("nvme", "list-subsys").CombinedOutput()
	if err != nil {
		t.Fatalf("nvme list-subsys: %v\n%s", err, out)
	}
	for _, want := range []string{nqn, "trsvcid=4420", "trsvcid=4421"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nvme list-subsys does not mention %s:\n%s", want, out)
		}
	}

	// Deleting a controller is a write to its write-only attribute.
	if err := fsys.WriteAttr("class/nvme/"+c2+"/delete_controller", "1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, c2+" gone", func() bool {
		_, err := fsys.Stat("class/nvme/" + c2)
		return sysfs.IsNotExist(err)
	})
	eventually(t, time.Minute, c1+" still live", attrIs(fsys, "class/nvme/"+c1+"/state", "live"))
}

func TestNVMeTCP_UnlinkedPortLeavesControllerConnecting(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-unlink"
	nvmeTwoPortTarget(t, l, nqn)
	fsys := sysfs.New("/sys")
	c1, c2 := connectTwoPorts(t, fsys, nqn)
	l.sh(t, fmt.Sprintf("nvmet_port_unlink 2 %q", nqn))
	eventually(t, 2*time.Minute, c2+" connecting", attrIs(fsys, "class/nvme/"+c2+"/state", "connecting"))
	if v, _ := fsys.ReadAttr("class/nvme/" + c1 + "/state"); v != "live" {
		t.Errorf("%s state = %q after the other port was unlinked, want live", c1, v)
	}
	l.sh(t, fmt.Sprintf("nvmet_port_link 2 %q", nqn))
	eventually(t, 2*time.Minute, c2+" live again", attrIs(fsys, "class/nvme/"+c2+"/state", "live"))
}

// subsystemOf returns the nvme-subsystem directory holding controller c.
func subsystemOf(t *testing.T, fsys sysfs.FS, c string) string {
	t.Helper()
	subs, err := fsys.ReadDir("class/nvme-subsystem")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		if _, err := fsys.Stat(path.Join("class/nvme-subsystem", s, c)); err == nil {
			return s
		}
	}
	t.Fatalf("controller %s is in no subsystem", c)
	return ""
}
