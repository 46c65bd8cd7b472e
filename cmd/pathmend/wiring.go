package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
	"k8s.io/klog/v2"
)

// sessionHeal runs the iSCSI session heal in the monitor's tick: one read
// of the iSCSI sysfs state (through one Reader kept across ticks, which
// reads what cannot change once per session), the healer's decisions,
// every decided verdict in pathmend_repairs_total (as the NVMe heal's:
// kind SessionDown, scope controller) and the recovery counters for every
// kick whose outcome is known.
type sessionHeal struct {
	healer  *iscsi.SessionHealer
	reader  *iscsi.Reader
	metrics *metrics.Metrics
	clock   clock.PassiveClock

	sys sysfs.FS

	// last are the iSCSI node conditions of the last tick, for
	// NodeGetStorageHealth; snap is its read, for CurrentDevices.
	mu   sync.Mutex
	last []volume.Condition
	snap *iscsi.Snapshot
}

func newSessionHeal(healer *iscsi.SessionHealer, sys sysfs.FS, m *metrics.Metrics, clk clock.PassiveClock) *sessionHeal {
	return &sessionHeal{healer: healer, reader: iscsi.NewReader(sys), metrics: m, clock: clk, sys: sys}
}

func (s *sessionHeal) Tick(ctx context.Context, records []volume.Record, recordsErr error) {
	snap, err := s.reader.Read(s.clock.Now())
	if err != nil {
		klog.ErrorS(err, "Read iSCSI state failed; skipping the session heal this tick")
		return
	}
	counts := map[heal.Kind]int{}
	var outcomes []heal.Outcome
	reports := s.healer.Tick(ctx, snap, records, recordsErr)
	s.mu.Lock()
	s.last, s.snap = iscsi.NodeConditions(reports), snap
	s.mu.Unlock()
	for _, r := range reports {
		// Every session seen down counts, in scope or not, as in
		// `pathmend diagnose`: the heal's scope limits kicks, not reports.
		if r.State != iscsi.SessionLoggedIn && r.DownFor > 0 {
			counts[iscsi.KindSessionDown]++
		}
		// Nothing decided yet, or a kick awaiting its outcome: no verdict.
		if r.Verdict == "" || r.Verdict == heal.Kicked {
			continue
		}
		outcomes = append(outcomes, heal.Outcome{
			Defect:  heal.Defect{Kind: iscsi.KindSessionDown, Scope: heal.ScopeController, Key: r.Node.HealKey()},
			Verdict: r.Verdict, Reason: r.Reason, Class: r.Class, Err: r.Err,
		})
		switch r.Verdict {
		case heal.Repaired:
			s.metrics.ObserveSessionRecovery(recoveryMethod(r.Kick), "logged_in")
		case heal.Failed:
			s.metrics.ObserveSessionRecovery(recoveryMethod(r.Kick), "failed")
		}
	}
	s.metrics.SetDefects(string(volume.TransportISCSI), counts)
	s.metrics.ObserveOutcomes(string(volume.TransportISCSI), outcomes)
}

// CurrentDevices returns, from the last tick's read, the block devices
// the LUN of each staged iSCSI volume in recs has (its disks and the map
// over them), by volume ID, for the monitor's staged-device check.
func (s *sessionHeal) CurrentDevices(recs []volume.Record) map[string][]volume.BlockDevice {
	s.mu.Lock()
	snap := s.snap
	s.mu.Unlock()
	out := map[string][]volume.BlockDevice{}
	if snap == nil {
		return out
	}
	m := iscsi.NewPortalMatcher(context.Background(), net.DefaultResolver)
	for _, r := range recs {
		if r.Context.ISCSI != nil {
			out[r.VolumeID] = iscsi.CurrentDevices(s.sys, snap, m, r.Context.ISCSI)
		}
	}
	return out
}

// conditions are the iSCSI node conditions of the last tick.
func (s *sessionHeal) conditions() []volume.Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// recoveryMethod names a kick the way the metric documents it.
func recoveryMethod(k iscsi.Kick) string {
	switch k {
	case iscsi.KickRelogin:
		return "logout_login"
	case iscsi.KickRestart:
		return "iscsid_restart"
	case iscsi.KickLogin:
		return "login"
	}
	return string(k)
}

// withMonitorNotes adds what the monitor's last tick decided about a
// volume (a deferred repair, a backed-off endpoint) to the condition its
// attacher reads from sysfs, so an operator sees "1 of 2 paths live; …;
// repair deferred: grace: nvme4 is 2s old, 3s left".
type withMonitorNotes struct {
	driver.Attacher
	mon *monitor.Monitor
}

func (w withMonitorNotes) Health(ctx context.Context, rec volume.Record) volume.Condition {
	c := w.Attacher.Health(ctx, rec)
	if st, ok := w.mon.Status(rec.VolumeID); ok && len(st.Notes) > 0 && c.Abnormal() {
		c.Message += "; " + strings.Join(st.Notes, "; ")
	}
	return c
}

// driverStaged gives the monitor, built before the driver (whose NVMe
// attacher reads the monitor's notes), the driver's staged-device check.
// d is set before the monitor runs.
type driverStaged struct {
	d *driver.Driver
}

func (s *driverStaged) StagedDevices(recs []volume.Record) (map[string]volume.StagedDevice, error) {
	return s.d.StagedDevices(recs)
}

// healthCheck is /healthz: the CSI server answers Probe over its socket,
// and the monitor finished a tick within maxAge (unless healing is off).
// It keeps one client connection to the socket for every check (closed by
// the returned func), and the metrics server runs it at most once a
// second (metrics.CachedCheck), so a flood of requests costs the plugin
// one Probe per second: a round trip on an open connection and two system
// calls on the state dir, no file written.
func healthCheck(endpoint string, mon *monitor.Monitor, mode heal.Mode, maxAge time.Duration) (metrics.HealthCheck, func(), error) {
	path, err := driver.ParseEndpoint(endpoint)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	identity := csi.NewIdentityClient(conn)
	ticked := tickCheck(mon, mode, maxAge)
	check := func(ctx context.Context) error {
		resp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			return fmt.Errorf("CSI server does not answer: %w", err)
		}
		if !resp.GetReady().GetValue() {
			return errors.New("CSI server is not ready")
		}
		return ticked(ctx)
	}
	return check, func() { conn.Close() }, nil
}
