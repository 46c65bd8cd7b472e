//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/internal/kmsg"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// TestNVMeTCP_SharedNQNWithDisjointCntlidRanges records what Linux does
// when two targets answer one subsystem NQN, each handing out controller
// IDs from its own range: both controllers join one nvme-subsystem; the
// second contributes a leg only when its namespace carries the same
// identifiers, and is a live controller with no leg when they differ.
func TestNVMeTCP_SharedNQNWithDisjointCntlidRanges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameUUID bool
		legs     int
	}{
		{name: "different namespace UUIDs: no leg via the second target", sameUUID: false, legs: 1},
		{name: "same namespace UUID: a second leg", sameUUID: true, legs: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := needLab(t)
			l.teardownAll(t)
			const nqn = "nqn.2024-01.io.pathmend.lab:e2e-shared"
			const alias = "nqn.2024-01.io.pathmend.lab:e2e-shared-b"
			uuidB := `"$(lab_uuid_of b)"`
			if tc.sameUUID {
				uuidB = `"$(lab_uuid_of a)"`
			}
			l.sh(t, fmt.Sprintf(`
modprobe nvme_tcp
nvmet_port_create 1 127.0.0.1 4420
nvmet_subsys_create %[1]q 1 99
nvmet_subsys_create %[2]q 100 199
nvmet_ns_add %[1]q 1 "$(lab_loop_create e2e-a 32)" 1 "$(lab_uuid_of a)"
nvmet_ns_add %[2]q 1 "$(lab_loop_create e2e-b 32)" 1 %[3]s
nvmet_port_link 1 %[1]q
nvmet_port_link 1 %[2]q
nqnproxy_start 127.0.0.3:4420 127.0.0.1:4420 %[1]q %[2]q
`, nqn, alias, uuidB))
			fsys := sysfs.New("/sys")
			ca := fabricsConnect(t, nqn, "127.0.0.1", "4420")
			cursor, err := kmsg.Cursor(kmsg.Path)
			if err != nil {
				t.Fatalf("kernel log: %v", err)
			}
			cb := fabricsConnect(t, nqn, "127.0.0.3", "4420")
			for _, c := range []string{ca, cb} {
				eventually(t, time.Minute, c+" live", attrIs(fsys, "class/nvme/"+c+"/state", "live"))
				if v, _ := fsys.ReadAttr("class/nvme/" + c + "/subsysnqn"); v != nqn {
					t.Fatalf("%s subsysnqn = %q, want %q", c, v, nqn)
				}
			}
			if v, _ := fsys.ReadAttr("class/nvme/" + cb + "/cntlid"); v != "100" {
				t.Errorf("%s cntlid = %q, want 100 (the second target's range)", cb, v)
			}
			sub := subsystemOf(t, fsys, ca)
			if got := subsystemOf(t, fsys, cb); got != sub {
				t.Fatalf("controllers in two subsystem instances (%s, %s): an ambiguous head", sub, got)
			}
			s := sub[len("nvme-subsys"):]
			leg := func(c string) string { return "class/nvme/" + c + "/nvme" + s + "c" + c[len("nvme"):] + "n1" }
			eventually(t, time.Minute, "the leg via "+ca, func() bool { _, err := fsys.Stat(leg(ca)); return err == nil })
			// The second controller's scan ends with its leg, or with the
			// kernel refusing the namespace: "nvme nvmeN: IDs don't match
			// for shared namespace 1". Either is the event to wait for.
			refused := func() bool {
				rs, _ := kmsg.Since(kmsg.Path, cursor)
				for _, r := range rs {
					if strings.Contains(r.Msg, cb+": IDs don't match for shared namespace") {
						return true
					}
				}
				return false
			}
			hasLeg := func() bool { _, err := fsys.Stat(leg(cb)); return err == nil }
			eventually(t, time.Minute, "the scan of namespace 1 via "+cb+": its leg, or the kernel's refusal", func() bool {
				return hasLeg() || refused()
			})
			if got := map[bool]int{true: 2, false: 1}[hasLeg()]; got != tc.legs {
				t.Errorf("legs of nvme%sn1 = %d, want %d", s, got, tc.legs)
			}
			if tc.legs == 1 && !refused() {
				t.Errorf("no leg via %s, and no refusal of the namespace in the kernel log", cb)
			}
		})
	}
}
