package metrics

import (
	"context"

	"k8s.io/utils/exec"
)

// countingExec counts every command it creates as a started process.
type countingExec struct {
	exec.Interface
	m *Metrics
}

// CountingExec wraps e so that every command it creates counts in
// pathmend_monitor_processes_started_total. The monitor's exec seam is
// built with it; on a healthy node the counter stays 0.
func (m *Metrics) CountingExec(e exec.Interface) exec.Interface {
	return countingExec{Interface: e, m: m}
}

func (c countingExec) Command(cmd string, args ...string) exec.Cmd {
	c.m.ProcessStarted()
	return c.Interface.Command(cmd, args...)
}

func (c countingExec) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	c.m.ProcessStarted()
	return c.Interface.CommandContext(ctx, cmd, args...)
}
