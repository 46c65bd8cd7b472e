package main

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/uevent"
)

// kernelEvents opens the kernel's uevent socket (--kernel-events) and
// returns the source the loop reads and the task that receives into it.
// When events are off, or the socket cannot be opened (a seccomp profile
// that denies netlink, say), it returns none: the loop then finds every
// change at its tick, as it does for what the kernel never announces,
// and says so once.
func kernelEvents(on bool, m *metrics.Metrics) (monitor.Events, []task) {
	if !on {
		return nil, nil
	}
	conn, err := uevent.Dial(0)
	if err != nil {
		klog.ErrorS(err, "Kernel events unavailable; the monitor finds changes at its tick only")
		return nil, nil
	}
	src := uevent.NewSource(conn, uevent.Config{Metrics: m})
	return src, []task{{"kernel events", func(ctx context.Context) error {
		if err := src.Run(ctx); err != nil {
			// The loop was told (a receive loss: one full read); it goes
			// on with its tick. A failed socket is not a failed process.
			klog.ErrorS(err, "Kernel events stopped; the monitor finds changes at its tick only")
		}
		return nil
	}}}
}
