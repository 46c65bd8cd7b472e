package attach

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/volume"
)

// stage attaches a volume with the staged ones as co-tenants and records
// it as the driver would.
func stage(t *testing.T, a *Attacher, recs *records, id string, vc volume.Context) volume.Record {
	t.Helper()
	att, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: id, Context: vc, CoTenants: recs.co(id)})
	if err != nil {
		t.Fatal(err)
	}
	r := record(id, vc, att.Device.Path)
	recs.add(r)
	return r
}

func unstage(t *testing.T, a *Attacher, recs *records, r volume.Record) {
	t.Helper()
	if err := a.Detach(context.Background(), r, recs.co(r.VolumeID)); err != nil {
		t.Fatal(err)
	}
	recs.remove(r.VolumeID)
}

// Two volumes on LUNs 0 and 1 of one target share both sessions. Detaching
// the first flushes its map and deletes its disks but keeps the sessions
// (co-tenant gate); detaching the second logs out and deletes the records.
func TestDetach_CoTenantGateKeepsSharedSessions(t *testing.T) {
	h := newFakeHost(t)
	h.LUNs = []int{0, 1}
	recs := &records{}
	a := h.attacher(nil)
	pv0 := stage(t, a, recs, "pv-0", iscsiVolume(0, "127.0.0.1", "127.0.0.2"))
	pv1 := stage(t, a, recs, "pv-1", iscsiVolume(1, "127.0.0.1", "127.0.0.2"))
	if pv0.Device != filepath.Join(h.dev, "dm-0") || pv1.Device != filepath.Join(h.dev, "dm-1") {
		t.Fatalf("devices %s %s", pv0.Device, pv1.Device)
	}
	snap, _ := iscsi.Read(a.cfg.Sys, a.cfg.Clock.Now())
	lun0 := disksOf(snap, pv0.Context.ISCSI)

	start := len(h.exec.Lines())
	unstage(t, a, recs, pv0)
	if diff := cmp.Diff([]string{"multipath -f mpatha"}, h.exec.Lines()[start:]); diff != "" {
		t.Errorf("detach of pv-0 ran (-want +got):\n%s", diff)
	}
	for _, d := range lun0 {
		dir := map[string]string{"sda": "devices/platform/host11/session1/target11:0:0/11:0:0:0", "sdc": "devices/platform/host12/session2/target12:0:0/12:0:0:0"}[d]
		if got := readWO(t, h.sys, dir+"/delete"); got != "1" {
			t.Errorf("%s/delete = %q, want 1", d, got)
		}
	}
	if n := h.SessionCount(); n != 2 {
		t.Fatalf("%d sessions after the first detach, want 2 (pv-1 uses them)", n)
	}

	start = len(h.exec.Lines())
	unstage(t, a, recs, pv1)
	want := []string{
		"multipath -f mpathb",
		"iscsiadm -m session -r 1 -u",
		"iscsiadm -m node -T " + iqn + " -p 127.0.0.1:3260 -I default -o delete",
		"iscsiadm -m session -r 2 -u",
		"iscsiadm -m node -T " + iqn + " -p 127.0.0.2:3260 -I default -o delete",
	}
	if diff := cmp.Diff(want, h.exec.Lines()[start:]); diff != "" {
		t.Errorf("detach of pv-1 ran (-want +got):\n%s", diff)
	}
	if n, keys := h.SessionCount(), h.RecordKeys(); n != 0 || len(keys) != 0 {
		t.Errorf("left: %d sessions, records %v", n, keys)
	}
	// Detaching again, or a volume never attached, is not an error.
	if err := a.Detach(context.Background(), pv1, volume.CoTenants{}); err != nil {
		t.Errorf("second detach: %v", err)
	}
}

// A volume being attached (its record attaching: the driver writes it
// before the first login) is a co-tenant too.
func TestDetach_AttachingVolumeIsACoTenant(t *testing.T) {
	h := newFakeHost(t)
	h.LUNs = []int{0, 1}
	recs := &records{}
	a := h.attacher(nil)
	pv0 := stage(t, a, recs, "pv-0", iscsiVolume(0, "127.0.0.1", "127.0.0.2"))
	pv1 := record("pv-1", iscsiVolume(1, "127.0.0.2"), "")
	pv1.State = volume.StateAttaching
	recs.add(pv1)
	if _, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: "pv-1", Context: iscsiVolume(1, "127.0.0.2"), CoTenants: recs.co("pv-1")}); err != nil {
		t.Fatal(err)
	}
	unstage(t, a, recs, pv0)
	lines := strings.Join(h.exec.Lines(), "\n")
	if strings.Contains(lines, "-m session -r 2 -u") || strings.Contains(lines, "-p 127.0.0.2:3260 -I default -o delete") {
		t.Fatalf("logged out the session pv-1 was just attached through:\n%s", lines)
	}
	if !strings.Contains(lines, "-m session -r 1 -u") {
		t.Error("the unshared session (127.0.0.1) was not logged out")
	}
}

// A map that will not flush (still open) stops the detach before any disk
// is deleted or any session logged out.
func TestDetach_FlushFailureStopsTheDetach(t *testing.T) {
	h := newFakeHost(t)
	recs := &records{}
	a := h.attacher(nil)
	pv := stage(t, a, recs, "pv-0", iscsiVolume(0, "127.0.0.1", "127.0.0.2"))
	h.FlushCode = 1
	start := len(h.exec.Lines())
	err := a.Detach(context.Background(), pv, recs.co(pv.VolumeID))
	if code, ok := iscsi.Exit(err); !ok || code != 1 || !strings.Contains(err.Error(), "mpatha: map in use") {
		t.Fatalf("got %v", err)
	}
	if n := len(h.exec.Lines()[start:]); n != flushAttempts {
		t.Errorf("%d commands, want %d flushes and nothing else", n, flushAttempts)
	}
	if h.SessionCount() != 2 {
		t.Error("sessions logged out after a failed flush")
	}
	if got := readWO(t, h.sys, "devices/platform/host11/session1/target11:0:0/11:0:0:0/delete"); got != "" {
		t.Errorf("disk deleted under an open map: %q", got)
	}
}

// A map still open for a moment after its unmount (udev probing it) is
// flushed on a later try; the detach goes on.
func TestDetach_AMapStillOpenForAMomentIsFlushedOnRetry(t *testing.T) {
	h := newFakeHost(t)
	recs := &records{}
	a := h.attacher(nil)
	pv := stage(t, a, recs, "pv-0", iscsiVolume(0, "127.0.0.1", "127.0.0.2"))
	h.FlushBusy = 2
	unstage(t, a, recs, pv)
	if n, keys := h.SessionCount(), h.RecordKeys(); n != 0 || len(keys) != 0 {
		t.Errorf("left: %d sessions, records %v", n, keys)
	}
}

// Expand rescans every live disk of the LUN and resizes the map.
func TestExpand_RescansEveryPathAndResizesTheMap(t *testing.T) {
	h := newFakeHost(t)
	recs := &records{}
	a := h.attacher(nil)
	pv := stage(t, a, recs, "pv-0", iscsiVolume(0, "127.0.0.1", "127.0.0.2"))
	if err := os.WriteFile(filepath.Join(h.sys, "devices/virtual/block/dm-0/size"), []byte("262144\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	size, err := a.Expand(context.Background(), pv)
	if err != nil || size != 128<<20 {
		t.Fatalf("Expand = %d, %v", size, err)
	}
	for _, dir := range []string{"devices/platform/host11/session1/target11:0:0/11:0:0:0", "devices/platform/host12/session2/target12:0:0/12:0:0:0"} {
		if got := readWO(t, h.sys, dir+"/rescan"); got != "1" {
			t.Errorf("%s/rescan = %q", dir, got)
		}
	}
	if l := h.exec.Lines(); l[len(l)-1] != "multipathd resize map mpatha" {
		t.Errorf("last command %q", l[len(l)-1])
	}
	if _, err := a.Expand(context.Background(), record("x", iscsiVolume(9, "127.0.0.1"), "")); !errors.Is(err, errNoDevice) {
		t.Errorf("expand of a LUN without disks: %v", err)
	}
}
