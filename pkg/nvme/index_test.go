package nvme

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme/nvmetest"
	"github.com/pathmend/pathmend/pkg/volume"
)

// An Index answers exactly as the package functions it stands in for, on
// random hosts with controllers in every state, shared NQNs (two
// subsystem instances answering one) and volumes that list endpoints no
// controller goes to.
func TestIndex_AnswersAsTheScans(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 19))
	for i := range 30 {
		h := readTopology(t, nvmetest.Random(r, randomLimits))
		x := NewIndex(h)
		exps := volumesOf(h)
		if len(exps) > 0 {
			e := exps[0]
			e.Endpoints = append(e.Endpoints, volume.Endpoint{Host: "192.0.2.99", Port: 4420})
			e.NQN += "-unknown"
			exps = append(exps, e)
		}
		for _, e := range exps {
			wantLoc, wantErr := Locate(h, e)
			gotLoc, gotErr := x.Locate(e)
			if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) || cmp.Diff(wantLoc, gotLoc) != "" {
				t.Fatalf("host %d, %s: Locate = %+v, %v; Index.Locate = %+v, %v", i, e.VolumeID, wantLoc, wantErr, gotLoc, gotErr)
			}
			if d := cmp.Diff(ReportPaths(h, e), x.ReportPaths(e)); d != "" {
				t.Fatalf("host %d, %s: ReportPaths (-scan +index):\n%s", i, e.VolumeID, d)
			}
			for _, ep := range e.Endpoints {
				want, got := ControllersTo(h, e.NQN, ep), x.ControllersTo(e.NQN, ep)
				if len(want) != len(got) {
					t.Fatalf("host %d, %s %s: ControllersTo %d controllers, Index %d", i, e.NQN, ep, len(want), len(got))
				}
				for j := range want {
					if want[j] != got[j] {
						t.Fatalf("host %d, %s %s: controller %d: %s, Index %s", i, e.NQN, ep, j, want[j].Name, got[j].Name)
					}
				}
			}
		}
	}
}
