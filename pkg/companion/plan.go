package companion

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// OpenStore returns the learned store of stateDir for reading, creating
// nothing: ok is false when stateDir has no learned directory (companion
// mode never ran there). `pathmend diagnose` reads it this way.
func OpenStore(stateDir string) (s *Store, ok bool, err error) {
	dir := filepath.Join(filepath.Clean(stateDir), learnedDir)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case !fi.IsDir():
		return nil, false, fmt.Errorf("%s: not a directory", dir)
	}
	return &Store{dir: dir}, true, nil
}

// Reconnect is an endpoint companion mode would connect again now, and why.
type Reconnect struct {
	NQN      string
	Endpoint string
	// Why: "given up by the kernel" or "torn down by a repair".
	Why string
}

// Plan is what companion mode would do about the learned subsystems on
// host, as a dry run: the defects of learned subsystems the node plugin
// does not own, with every namespace counted as in use (their
// co-tenants extended as the heal does), the policy's verdict on them,
// and the endpoints it would connect again. Owned lists the learned
// subsystems it leaves to the node plugin.
func Plan(host *nvme.Host, learned []Subsystem, records volume.Listing, p *heal.Policy) (outs []heal.Outcome, reconnects []Reconnect, owned []string) {
	own := OwnerOf(records)
	mine := map[string]bool{}
	for _, s := range learned {
		if own.Owns(s.NQN) {
			owned = append(owned, s.NQN)
			continue
		}
		mine[s.NQN] = true
		for _, e := range s.Endpoints {
			present := slices.ContainsFunc(host.Controllers, func(c nvme.Controller) bool {
				return c.SubsysNQN == s.NQN && GoesTo(&c, e.Endpoint) && !c.State.Deleting()
			})
			if !e.WantsConnect() || present {
				continue
			}
			why := "given up by the kernel"
			if e.TornDown {
				why = "torn down by a repair"
			}
			reconnects = append(reconnects, Reconnect{NQN: s.NQN, Endpoint: e.String(), Why: why})
		}
	}
	var defects []heal.Defect
	for _, d := range nvme.Inspect(host, nil) {
		if mine[nvme.TeardownNQN(host, d)] {
			Strand(host, &d)
			defects = append(defects, d)
		}
	}
	return p.Plan(defects), reconnects, owned
}
