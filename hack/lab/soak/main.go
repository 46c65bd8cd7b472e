// Command soak is pathmend's fault soak, run in the lab guest by `make
// soak` (hack/lab/guest/soak.sh builds the targets first): volumes staged
// through pathmend's CSI socket carry continuous verified I/O while a
// seeded schedule of faults hits their paths, pathmend itself and the
// volumes, and pathmend serves in repair mode with short intervals. It
// ends with a report (text and JSON) whose must-be-0 checks decide the
// exit status: data mismatches, teardowns of a live and healthy path,
// read-only windows no outage explains or pathmend did not report, kernel
// objects left behind.
//
// Usage (in the guest, as root):
//
//	soak -lab /lab -out /lab/out/soak -minutes 5 [-seed N] [-only kind,kind]
//
// The volumes (guest/soak_lib.sh builds their targets):
//
//	vol-a1  ext4       NVMe subsystem A nsid 1, ports optimized + non-optimized
//	vol-a2  raw block  NVMe subsystem A nsid 2 (the same two controllers)
//	vol-b   ext4       NVMe subsystem B: a direct array and an alias array
//	                   behind nqnproxy, ctrlLossTmo 30 s
//	vol-i   ext4       iSCSI, two TPGs, one behind the flaky proxy, dm-multipath
//
// Packages: block (the self-describing block), workload (writers and
// verifiers), plan (the fault catalogue and the seeded schedule),
// observe (sysfs from outside pathmend) and report.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/plan"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fl := flag.NewFlagSet("soak", flag.ContinueOnError)
	lab := fl.String("lab", "/lab", "the lab share: bin/ (pathmend) and guest/ (the target helpers)")
	out := fl.String("out", "/lab/out/soak", "where the report, pathmend's log and the timeline go")
	minutes := fl.Float64("minutes", 5, "minutes during which faults start (the run lasts longer: setup, the last faults' holds, settling, checks)")
	seed := fl.Uint64("seed", 0, "seed of the fault schedule; 0 picks one (printed, so the run replays)")
	only := fl.String("only", "", "comma-separated fault kinds to draw from (default: the whole catalogue)")
	root := fl.String("root", "/run/soak", "directory of pathmend's socket and state and of the staging and target paths")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1
	}
	o := plan.DefaultOptions
	if *only != "" {
		for _, k := range strings.Split(*only, ",") {
			if !knownKind(plan.Kind(k)) {
				fmt.Fprintf(os.Stderr, "soak: unknown fault kind %q; the catalogue: %v\n", k, plan.Kinds)
				return 2
			}
			o.Only = append(o.Only, plan.Kind(k))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := newSoak(config{
		lab: *lab, out: *out, root: *root, seed: *seed,
		duration: time.Duration(*minutes * float64(time.Minute)), options: o,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	pass, err := s.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	if !pass {
		return 1
	}
	return 0
}

func knownKind(k plan.Kind) bool {
	for _, x := range plan.Kinds {
		if x == k {
			return true
		}
	}
	return false
}
