package nvme

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Detacher deletes one controller (writes its delete_controller).
type Detacher interface {
	Disconnect(ctrl string) error
}

// Rescanner asks one controller to rescan its namespaces.
type Rescanner interface {
	Rescan(ctrl string) error
}

// Repairer is the NVMe repair mechanism: it executes a defect's plan
// exactly as given — delete these controllers in this order — and returns
// what it removed. It decides nothing; heal.Policy does.
//
// NamespaceMissing has a gentle first step (heal.FirstStepper): every
// live controller of the plan rescans its namespaces, and the repairer
// watches sysfs up to RescanWait for the namespace. The policy runs it
// before deciding on the teardown and whatever it decides: a rescan tears
// nothing down, so a teardown refused for its co-tenants does not hold it
// back. Only if the namespace still has not appeared may the policy let
// the controllers be torn down.
type Repairer struct {
	Detacher  Detacher
	Rescanner Rescanner
	// SysFS and Expectations let the repairer look again after a rescan.
	SysFS        sysfs.FS
	Expectations []Expectation
	// RescanWait bounds the wait for a rescanned namespace (default 2 s).
	RescanWait time.Duration
	// Poll is the interval of that wait (default 100 ms).
	Poll time.Duration
	// Clock times the wait; the real clock when nil.
	Clock clock.Clock
}

var (
	_ heal.Repairer     = (*Repairer)(nil)
	_ heal.FirstStepper = (*Repairer)(nil)
)

// FirstStep names the rescan of a NamespaceMissing defect: its live
// controllers, "rescan nvme0, nvme1"; "" for other defects or when no
// controller of the plan is live.
func (r *Repairer) FirstStep(d heal.Defect) string {
	if d.Kind != heal.NamespaceMissing || r.Rescanner == nil {
		return ""
	}
	var live []string
	for _, p := range d.Teardown {
		if p.State == string(StateLive) {
			live = append(live, p.Name)
		}
	}
	if len(live) == 0 {
		return ""
	}
	return "rescan " + strings.Join(live, ", ")
}

// TryFirstStep rescans the live controllers of d's plan and reports
// whether the namespace appeared within RescanWait.
func (r *Repairer) TryFirstStep(ctx context.Context, d heal.Defect) (bool, error) {
	cured, err := r.rescan(ctx, d)
	if cured {
		klog.InfoS("Namespace appeared after a rescan; nothing torn down", "defect", d.Kind, "key", d.Key, "volumes", d.Volumes)
	}
	return cured, err
}

// Repair executes d's teardown plan. On an error it stops and returns
// what it removed so far with the error.
func (r *Repairer) Repair(ctx context.Context, d heal.Defect) ([]heal.Path, error) {
	var removed []heal.Path
	for _, p := range d.Teardown {
		if err := r.Detacher.Disconnect(p.Name); err != nil {
			return removed, fmt.Errorf("tear down %s (%s): %w", p.Name, p.Endpoint, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// rescan asks every live controller of the plan to rescan, then watches
// sysfs until the same defect is gone (cured) or RescanWait passes.
func (r *Repairer) rescan(ctx context.Context, d heal.Defect) (cured bool, err error) {
	for _, p := range d.Teardown {
		if p.State != string(StateLive) {
			continue
		}
		if err := r.Rescanner.Rescan(p.Name); err != nil {
			klog.ErrorS(err, "Rescan failed", "controller", p.Name)
		}
	}
	wait, poll := r.RescanWait, r.Poll
	if wait <= 0 {
		wait = 2 * time.Second
	}
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	start := clk.Now()
	for {
		if clk.Since(start) >= wait {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-clk.After(poll):
		}
		h, err := Read(r.SysFS)
		if err != nil {
			continue
		}
		if !stillPresent(Inspect(h, r.Expectations), d) {
			return true, nil
		}
	}
}

func stillPresent(defects []heal.Defect, d heal.Defect) bool {
	for _, x := range defects {
		if x.Kind == d.Kind && x.Key == d.Key {
			return true
		}
	}
	return false
}
