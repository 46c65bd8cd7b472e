package nvme

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// On Debian's 6.1 kernel a read of a fabrics controller's address while
// nvme-tcp resets or reconnects it can oops in nvme_tcp_get_address and
// leave the controller resetting for good (found by the soak: NodeUnstage
// then hung on its deletion). So the address is read only while the
// controller is live; one seen live keeps the address it had then, and
// one never seen live has no known address. The test replaces address
// with a directory whenever the controller is not live: any read of it
// then fails the Read.
func TestReader_ReadsTheAddressOnlyWhileLive(t *testing.T) {
	ep := volume.Endpoint{Host: "192.0.2.1", Port: 4421}
	exp := Expectation{VolumeID: "v", NQN: "nqn.2024-01.io.pathmend.test:a", NSID: 1,
		Endpoints: []volume.Endpoint{{Host: "192.0.2.1", Port: 4420}, ep}}
	for _, scope := range []Scope{ScopeAll, ScopePaths} {
		dir := t.TempDir()
		tree, err := nvmetest.NewTree(dir, twoPathTopology(), testNow)
		if err != nil {
			t.Fatal(err)
		}
		ctrlDir := filepath.Join(dir, ctl(1))
		// set changes nvme1 without changing its directory's identity
		// (its mtime), as the kernel changes a controller it keeps.
		set := func(state string, addressReadable bool) {
			t.Helper()
			st, err := os.Stat(ctrlDir)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(ctrlDir, "state")
			if err := os.Chmod(p, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(state+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			a := filepath.Join(ctrlDir, "address")
			if err := os.RemoveAll(a); err != nil {
				t.Fatal(err)
			}
			if addressReadable {
				err = os.WriteFile(a, []byte("traddr=192.0.2.1,trsvcid=4421,src_addr=192.0.2.100\n"), 0o444)
			} else {
				err = os.Mkdir(a, 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(ctrlDir, st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
		}
		r := NewReader(tree.FS(), scope)
		read := func(what string) *Controller {
			t.Helper()
			h, err := r.Read()
			if err != nil {
				t.Fatalf("scope %v, %s: %v", scope, what, err)
			}
			c, ok := h.Controller("nvme1")
			if !ok {
				t.Fatalf("scope %v, %s: no nvme1", scope, what)
			}
			to := ControllersTo(h, exp.NQN, ep)
			present := 1 // a controller being deleted is no path
			if c.State.Deleting() {
				present = 0
			}
			unplaced := Unplaced(h, exp.NQN)
			switch {
			case c.AddressUnknown && (len(to) != 0 || len(unplaced) != 1 || !Covered(h, exp.NQN, ep)):
				t.Errorf("scope %v, %s: unknown nvme1: ControllersTo %d, Unplaced %d, Covered %v; want 0, 1, true", scope, what, len(to), len(unplaced), Covered(h, exp.NQN, ep))
			case !c.AddressUnknown && (len(to) != present || len(unplaced) != 0):
				t.Errorf("scope %v, %s: nvme1 at %v: ControllersTo %d, Unplaced %d; want %d, 0", scope, what, c.Address, len(to), len(unplaced), present)
			}
			return c
		}

		set("connecting", false)
		c := read("connecting, never seen live")
		if !c.AddressUnknown || c.Address != (Address{}) || c.RawAddress != "" {
			t.Errorf("scope %v: connecting, never seen live: %+v %q, want an unknown address", scope, c.Address, c.RawAddress)
		}
		h, _ := r.Read()
		pr := ReportPaths(h, exp)
		if pr.Live != 1 || !slices.ContainsFunc(pr.Problems, func(p string) bool { return strings.Contains(p, AddressNotKnown) }) {
			t.Errorf("scope %v: report %+v, want one live path and %q", scope, pr, AddressNotKnown)
		}
		if ds := Inspect(h, []Expectation{exp}); len(ds) != 0 {
			t.Errorf("scope %v: Inspect found %v on a controller of unknown address", scope, ds)
		}

		set("live", true)
		c = read("live")
		want := Address{Traddr: "192.0.2.1", Trsvcid: "4421"}
		if scope == ScopeAll {
			want.SrcAddr = "192.0.2.100"
		}
		if c.AddressUnknown || c.Address != want {
			t.Errorf("scope %v: live: %+v (unknown %v), want %+v", scope, c.Address, c.AddressUnknown, want)
		}

		for _, state := range []string{"resetting", "connecting", "deleting"} {
			set(state, false)
			c = read(state + " after live")
			if c.AddressUnknown || c.Address != (Address{Traddr: "192.0.2.1", Trsvcid: "4421"}) || c.RawAddress != "" {
				t.Errorf("scope %v: %s after live: %+v %q (unknown %v), want the address seen live without src_addr", scope, state, c.Address, c.RawAddress, c.AddressUnknown)
			}
		}
		set("connecting", false)
		fresh, err := Read(tree.FS())
		if err != nil {
			t.Fatalf("fresh read of a connecting controller: %v", err)
		}
		if c, _ := fresh.Controller("nvme1"); !c.AddressUnknown {
			t.Errorf("a fresh Read knows the address of a controller it never saw live: %+v", c.Address)
		}
	}
}
