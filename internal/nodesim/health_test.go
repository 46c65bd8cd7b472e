package nodesim

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// probeHealth is kubelet's volume health manager asking the plugin about
// volume v between two scheduling decisions (no actor moves while it
// runs: the RPC only reads). Its answer must be what a fresh read of the
// node gives now, or — when the plugin answered from the node model — the
// model's entry of v, read at most the loop's bound ago.
func (s *sim) probeHealth(v *vol) {
	p := s.proc
	var rec volume.Record
	found := false
	for _, r := range s.records() {
		if r.VolumeID == v.id {
			rec, found = r, true
		}
	}
	entry, hasEntry := p.model.Snapshot().Volume(v.id)
	resp, err := p.drv.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: v.id})
	if !found {
		if status.Code(driver.ToStatus(err)) != codes.NotFound {
			s.fail("health of %s, which has no record: %v, want NotFound", v.id, err)
		}
		return
	}
	if err != nil {
		s.fail("health of %s: %v", v.id, err)
	}
	var got []volume.Condition
	for _, h := range resp.GetVolumeHealth().GetHealthStatuses() {
		st := volume.Degraded
		if h.GetStatus() == csi.VolumeHealthErrorType_INACCESSIBLE {
			st = volume.Inaccessible
		}
		got = append(got, volume.Condition{Status: st, Reason: h.GetReason(), Message: h.GetMessage()})
	}
	fresh := model.Volume{Condition: s.freshCondition(rec), Notes: entry.Notes, Facts: entry.Facts}.Conditions()
	age := s.clk.Now().Sub(entry.ReadAt)
	switch {
	case sameHealth(got, fresh):
		s.logf("health %s: %s (a fresh read's)", v.id, healthString(got))
	case hasEntry && age <= p.mon.Bound() && sameConditions(got, entry.Conditions()):
		s.logf("health %s: %s (the model's, read %s ago)", v.id, healthString(got), age)
	default:
		s.fail("health of %s is %s; a fresh read gives %s, and the model's entry (%t, read %s ago, bound %s) %s",
			v.id, healthString(got), healthString(fresh), hasEntry, age, p.mon.Bound(), healthString(entry.Conditions()))
	}
}

// freshCondition is the condition of rec as a fresh, full read of the
// node gives it now: a staging mount that is gone, or the volume's paths
// graded.
func (s *sim) freshCondition(rec volume.Record) volume.Condition {
	if rec.AccessType == volume.AccessMount {
		if mounted, err := s.mounts.IsMountPoint(rec.StagingPath); err == nil && !mounted {
			return volume.Condition{Status: volume.Inaccessible, Reason: "NotMounted", Message: fmt.Sprintf("filesystem is not mounted at staging path %s", rec.StagingPath)}
		}
	}
	var c volume.Condition
	var fsys sysfs.FS
	if e, ok := nvme.ExpectationFromRecord(rec); ok {
		fsys = s.kernel.FS()
		h, err := nvme.Read(fsys)
		if err != nil {
			s.fail("fresh read: %v", err)
		}
		c = nvme.ConditionOf(nvme.ReportPaths(h, e))
		c.Devices = nvme.CurrentDevices(fsys, h, e)
	} else {
		fsys = sysfs.New(s.host.Sys)
		snap, err := iscsi.Read(fsys, s.clk.Now())
		if err != nil {
			s.fail("fresh read: %v", err)
		}
		m := iscsi.NewPortalMatcher(context.Background(), nil)
		c, _ = iscsi.Grade(m, snap, rec.Context.ISCSI, nil)
		c.Devices = iscsi.CurrentDevices(fsys, snap, m, rec.Context.ISCSI)
	}
	if r, ok := s.freshReplaced(rec, fsys, c); ok {
		return r
	}
	return c
}

// freshReplaced is the condition of a filesystem volume whose staging
// mount (the topmost that is not someone else's) is on a device that is
// not among the devices its paths lead to now (c's).
func (s *sim) freshReplaced(rec volume.Record, fsys sysfs.FS, c volume.Condition) (volume.Condition, bool) {
	if rec.AccessType != volume.AccessMount {
		return volume.Condition{}, false
	}
	infos, err := s.mounts.MountInfo()
	if err != nil {
		s.fail("fresh read of the mount table: %v", err)
	}
	var ours []volume.Mount
	for _, m := range driver.MountsOf(infos) {
		if !s.mounts.IsForeign(m.ID) {
			ours = append(ours, m)
		}
	}
	if p, err := filepath.EvalSymlinks(rec.StagingPath); err == nil {
		rec.StagingPath = p
	}
	staged, ok := volume.FindStagedDevice(rec, ours, nil)
	if !ok {
		return volume.Condition{}, false
	}
	_, err = fsys.Stat("dev/block/" + staged.Device.Number.String())
	return volume.Replaced(rec, staged, c.Devices, err != nil)
}

// sameHealth compares an answer with a fresh read's: the same statuses
// and reasons, and the same count of live paths. The rest of a message
// describes paths that are not live, and may differ where the plugin
// remembers the address of a controller it saw live and a fresh read
// does not (nvme.Reader), or counts how long a session has been down.
func sameHealth(got, fresh []volume.Condition) bool {
	if len(got) != len(fresh) {
		return false
	}
	for i := range got {
		if got[i].Status != fresh[i].Status || got[i].Reason != fresh[i].Reason || livePart(got[i].Message) != livePart(fresh[i].Message) {
			return false
		}
	}
	return true
}

// livePart is "1 of 2 paths live" of a path condition's message.
func livePart(msg string) string {
	before, _, _ := strings.Cut(msg, ";")
	return before
}

func sameConditions(a, b []volume.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Status != b[i].Status || a[i].Reason != b[i].Reason || a[i].Message != b[i].Message {
			return false
		}
	}
	return true
}

func healthString(cs []volume.Condition) string {
	if len(cs) == 0 {
		return "healthy"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s/%s %q", c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, ", ")
}
