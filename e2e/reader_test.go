//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// TestReader_NVMeOnARealKernel checks, on kernfs, what the incremental
// NVMe read rests on (docs/performance.md): a controller re-created under
// its name has a new inode number; a controller's directory keeps its
// identity while legs come and go below it and its ANA states and
// connection change; one read(2) returns a whole attribute; and at every
// quiet moment a Reader kept across all of it returns what a fresh read
// returns, while its second read of an unchanged host reads only the
// attributes that can change.
func TestReader_NVMeOnARealKernel(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const nqn = "nqn.2024-01.io.pathmend.lab:e2e-reader"
	nvmeTwoPortTarget(t, l, nqn)
	sys := sysfs.New("/sys")
	c1, c2 := connectTwoPorts(t, sys, nqn)
	sub := subsystemOf(t, sys, c1)
	s := strings.TrimPrefix(sub, "nvme-subsys")
	leg := func(c string) string {
		return "class/nvme/" + c + "/nvme" + s + "c" + strings.TrimPrefix(c, "nvme") + "n1"
	}
	legsOptimal := func(c2State string) {
		t.Helper()
		eventually(t, time.Minute, "optimized leg via "+c1, attrIs(sys, leg(c1)+"/ana_state", "optimized"))
		eventually(t, time.Minute, c2State+" leg via "+c2, attrIs(sys, leg(c2)+"/ana_state", c2State))
	}
	legsOptimal("non-optimized")

	r := nvme.NewReader(sys, nvme.ScopeAll)
	paths := nvme.NewReader(sys, nvme.ScopePaths)
	// The one place a kept Reader may differ from a fresh Read: address
	// is read only while a controller is live (docs/performance.md), so
	// a fresh Read of a controller that is connecting does not know it,
	// and a Reader that saw the controller live remembers it. What it
	// remembers must be what the controller showed while live (without
	// src_addr, which follows the connection); it is then compared as
	// unknown, as a fresh Read has it.
	seenLive := map[nvme.ControllerName]nvme.Address{}
	forgetRemembered := func(step, reader string, h *nvme.Host) {
		t.Helper()
		for i := range h.Controllers {
			c := &h.Controllers[i]
			if c.State == nvme.StateLive && !c.AddressUnknown {
				seenLive[c.Name] = c.Address
				continue
			}
			if c.State == nvme.StateLive || !c.Fabrics() || c.AddressUnknown {
				continue
			}
			w, ok := seenLive[c.Name]
			got := c.Address
			if !ok || got.Traddr != w.Traddr || got.Trsvcid != w.Trsvcid || got.HostTraddr != w.HostTraddr || got.HostIface != w.HostIface || got.SrcAddr != "" || c.RawAddress != "" {
				t.Fatalf("%s: %s Reader remembers %s (%s) at %+v (raw %q); live it showed %+v", step, reader, c.Name, c.State, got, c.RawAddress, w)
			}
			c.Address, c.AddressUnknown = nvme.Address{}, true
		}
	}
	same := func(step string) *nvme.Host {
		t.Helper()
		want := settled(t, step, func() (*nvme.Host, error) { return nvme.Read(sys) })
		got, err := r.Read()
		if err != nil {
			t.Fatalf("%s: Reader: %v", step, err)
		}
		forgetRemembered(step, "ScopeAll", got)
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("%s: Reader differs from a fresh Read (-fresh +reader):\n%s", step, d)
		}
		p, err := paths.Read()
		if err != nil {
			t.Fatalf("%s: ScopePaths Reader: %v", step, err)
		}
		forgetRemembered(step, "ScopePaths", p)
		if d := cmp.Diff(nvme.Inspect(want, nil), nvme.Inspect(p, nil)); d != "" {
			t.Fatalf("%s: Inspect differs on the ScopePaths Host (-full +paths):\n%s", step, d)
		}
		return got
	}
	id := func(c string) sysfs.Identity {
		t.Helper()
		v, err := sys.Identity("class/nvme/" + c)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	h := same("connected")
	c1ID, c2ID := id(c1), id(c2)
	// One read of an unchanged host: state, cntlid, kato, address and
	// three timeouts per controller, ANA state and group per leg, the
	// subsystem's iopolicy and the head's size.
	before := r.Counts()
	same("unchanged")
	if got, want := r.Counts().Reads-before.Reads, 2*7+2*2+1+1; got != want {
		t.Errorf("second read of an unchanged host opened %d attribute files, want %d", got, want)
	}
	// One read(2) of a page returns a whole attribute: the model is
	// padded to 40 bytes, the address is the longest value read.
	sb, _ := h.Subsystem(nvme.SubsystemName(sub))
	model, err := os.ReadFile("/sys/class/nvme-subsystem/" + sub + "/model")
	if err != nil || sb.Model != strings.TrimRight(string(model), "\n ") {
		t.Errorf("model read %q, os.ReadFile %q (%v)", sb.Model, model, err)
	}

	// ANA flip on the target.
	l.sh(t, "nvmet_port_ana 2 1 inaccessible")
	legsOptimal("inaccessible")
	same("ANA inaccessible")
	l.sh(t, "nvmet_port_ana 2 1 non-optimized")
	legsOptimal("non-optimized")

	// The port behind c2 goes away and comes back: connecting (src_addr
	// gone), then live again after a reconnect.
	l.sh(t, fmt.Sprintf("nvmet_port_unlink 2 %q", nqn))
	eventually(t, time.Minute, c2+" connecting", attrIs(sys, "class/nvme/"+c2+"/state", "connecting"))
	same("port 2 unlinked")
	l.sh(t, fmt.Sprintf("nvmet_port_link 2 %q", nqn))
	eventually(t, 2*time.Minute, c2+" live again", attrIs(sys, "class/nvme/"+c2+"/state", "live"))
	legsOptimal("non-optimized")
	same("port 2 relinked")

	// The namespace goes away (its head and legs with it) and comes back.
	l.sh(t, fmt.Sprintf("nvmet_ns_disable %q 1", nqn))
	eventually(t, time.Minute, "legs gone", func() bool {
		_, err := sys.Stat(leg(c1))
		return sysfs.IsNotExist(err)
	})
	same("namespace disabled")
	l.sh(t, fmt.Sprintf("nvmet_ns_enable %q 1", nqn))
	legsOptimal("non-optimized")
	same("namespace enabled")

	// kernfs leaves a directory's times alone when children come and go:
	// c1 kept its identity through all of the above.
	if got := id(c1); got != c1ID {
		t.Errorf("%s identity changed from %+v to %+v while only its legs and state changed", c1, c1ID, got)
	}
	if got := id(c2); got != c2ID {
		t.Errorf("%s identity changed from %+v to %+v through a reconnect", c2, c2ID, got)
	}

	// c2 deleted and connected again: the kernel hands out the lowest
	// free instance, so the new controller usually takes c2's name; its
	// directory is a new kernfs node with a new inode number.
	l.sh(t, "nvme_host_delete "+c2)
	eventually(t, time.Minute, c2+" deleted", func() bool {
		_, err := sys.Stat("class/nvme/" + c2)
		return sysfs.IsNotExist(err)
	})
	same(c2 + " deleted")
	again := fabricsConnect(t, nqn, "127.0.0.1", "4421")
	eventually(t, time.Minute, again+" live", attrIs(sys, "class/nvme/"+again+"/state", "live"))
	c2 = again
	legsOptimal("non-optimized")
	if got := id(again); got.Ino == c2ID.Ino {
		t.Errorf("the controller connected after %s was deleted has its inode number %d", again, got.Ino)
	}
	t.Logf("re-created controller: %s, inode %d (was %d)", again, id(again).Ino, c2ID.Ino)
	same("controller re-created")
}

// settled returns a fresh read once two of them 200ms apart agree: the
// kernel finishes a change (a namespace's legs go before its head) in
// steps, and the readers are compared at a quiet moment.
func settled[T any](t *testing.T, step string, read func() (T, error)) T {
	t.Helper()
	prev, err := read()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err != nil {
			t.Fatalf("%s: fresh read: %v", step, err)
		}
		time.Sleep(200 * time.Millisecond)
		cur, cerr := read()
		if cerr == nil && cmp.Diff(prev, cur) == "" {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: sysfs did not settle in 20s", step)
		}
		prev, err = cur, cerr
	}
}

// TestReader_ISCSIOnARealKernel: a Reader kept across sessions failing,
// recovering, logging out and in (a new session ID, the old host and
// disk names reused) returns at every quiet moment what a fresh read
// returns.
func TestReader_ISCSIOnARealKernel(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-reader"
	lioTarget(t, l, iqn, "e2e-reader", "", "", "127.0.0.1", "127.0.0.2")
	l.sh(t, fmt.Sprintf(`
iscsi_discover 127.0.0.1 >/dev/null
for p in 127.0.0.1:3260 127.0.0.2:3260; do iscsi_login %q $p >/dev/null; done
`, iqn))
	sys := sysfs.New("/sys")
	state := func(portal, want string) {
		t.Helper()
		s := l.sh(t, fmt.Sprintf("iscsi_session_of %q %s:3260", iqn, portal))
		eventually(t, 4*time.Minute, s+" "+want, attrIs(sys, "class/iscsi_session/"+s+"/state", want))
	}
	state("127.0.0.1", "LOGGED_IN")
	state("127.0.0.2", "LOGGED_IN")
	eventually(t, 2*time.Minute, "a multipath map", func() bool {
		snap, err := iscsi.Read(sys, time.Now())
		return err == nil && len(snap.Maps) == 1 && len(snap.Maps[0].Slaves) == 2
	})
	r := iscsi.NewReader(sys)
	same := func(step string) {
		t.Helper()
		now := time.Now()
		want := settled(t, step, func() (*iscsi.Snapshot, error) { return iscsi.Read(sys, now) })
		got, err := r.Read(now)
		if err != nil {
			t.Fatalf("%s: Reader: %v", step, err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("%s: Reader differs from a fresh Read (-fresh +reader):\n%s", step, d)
		}
	}
	same("logged in")
	same("unchanged")

	l.sh(t, fmt.Sprintf("lio_tpg_disable %q 1", iqn))
	state("127.0.0.2", "FAILED")
	same("target portal group disabled")
	l.sh(t, fmt.Sprintf("lio_tpg_enable %q 1", iqn))
	state("127.0.0.2", "LOGGED_IN")
	same("target portal group enabled")

	l.sh(t, fmt.Sprintf(`timeout 60 iscsiadm -m node -T %q -p 127.0.0.2:3260 --logout >/dev/null
iscsi_login %q 127.0.0.2:3260 >/dev/null`, iqn, iqn))
	state("127.0.0.2", "LOGGED_IN")
	eventually(t, 2*time.Minute, "the map's second path back", func() bool {
		snap, err := iscsi.Read(sys, time.Now())
		return err == nil && len(snap.Maps) == 1 && len(snap.Maps[0].Slaves) == 2
	})
	same("logged out and in again")
}
