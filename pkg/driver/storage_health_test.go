package driver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// NodeGetStorageHealth reports the node's conditions with stable reasons:
// HEALTHY (no entry) when none holds; the heal switched off; staged-volume
// records that cannot be read (the readable ones still reported); and the
// conditions the loop wrote into the node model (unreachable targets,
// stuck iSCSI sessions),
// one entry per (status, reason).
func TestNodeGetStorageHealth_NodeConditions(t *testing.T) {
	newDriver := func(t *testing.T, mode heal.Mode, conds func() []volume.Condition) (*driver.Driver, *volume.Store, string) {
		t.Helper()
		dir := t.TempDir()
		store, err := volume.NewStore(filepath.Join(dir, "state"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig("ext4")
		cfg.HealMode = mode
		fa := &fakeAttacher{device: filepath.Join(dir, "dev-fake")}
		tb := mountstest.New()
		d, err := driver.New(cfg, driver.Deps{
			SysFS: sysfs.New(dir), Intents: ownerOf(t, store), Exec: utilexec.New(),
			Mounter:      mount.NewSafeFormatAndMount(tb, utilexec.New()),
			UnmountLayer: tb.UnmountLayer, MountNamespace: tb.Namespace,
			Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: fa, volume.TransportISCSI: fa},
			MountInfo: func() ([]mount.MountInfo, error) { return nil, nil }, Model: nodeModel(conds),
		})
		if err != nil {
			t.Fatal(err)
		}
		return d, store, filepath.Join(dir, "state")
	}
	entries := func(t *testing.T, d *driver.Driver) map[string]*csi.NodeGetStorageHealthResponse_StorageBackendHealth {
		t.Helper()
		resp, err := d.NodeGetStorageHealth(context.Background(), &csi.NodeGetStorageHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*csi.NodeGetStorageHealthResponse_StorageBackendHealth{}
		for _, b := range resp.GetBackendHealth() {
			k := b.GetStatus().String() + " " + b.GetReason()
			if out[k] != nil {
				t.Errorf("two entries for %s", k)
			}
			out[k] = b
		}
		return out
	}

	t.Run("healthy", func(t *testing.T) {
		d, _, _ := newDriver(t, heal.ModeRepair, func() []volume.Condition { return nil })
		if got := entries(t, d); len(got) != 0 {
			t.Errorf("entries on a healthy node: %v", got)
		}
	})

	t.Run("heal off", func(t *testing.T) {
		d, _, _ := newDriver(t, heal.ModeOff, nil)
		got := entries(t, d)
		e := got["STORAGE_DEGRADED "+driver.ReasonHealOff]
		if len(got) != 1 || e == nil || !strings.Contains(e.GetMessage(), "--heal=repair") {
			t.Errorf("entries = %v", got)
		}
	})

	t.Run("unreadable records", func(t *testing.T) {
		d, store, state := newDriver(t, heal.ModeRepair, nil)
		for _, id := range []string{"pv-ok", "pv-torn"} {
			c, _, err := volume.Parse(map[string]string{"transport": "nvme-tcp", "nqn": "nqn.2014-08.io.example:a", "endpoints": "127.0.0.1:4420", "nsid": "1"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Put(volume.Record{VolumeID: id, State: volume.StateStaged, Context: c, AccessType: volume.AccessBlock, StagingPath: "/staging/" + id}); err != nil {
				t.Fatal(err)
			}
		}
		files, _ := filepath.Glob(filepath.Join(state, "volumes", "*.json"))
		var torn string
		for _, f := range files {
			if b, _ := os.ReadFile(f); strings.Contains(string(b), `"pv-torn"`) {
				torn = f
			}
		}
		if err := os.WriteFile(torn, []byte(`{"version": 1, "volumeID": "pv-to`), 0o600); err != nil {
			t.Fatal(err)
		}
		got := entries(t, d)
		e := got["STORAGE_DEGRADED "+driver.ReasonRecordsUnreadable]
		if e == nil || !strings.Contains(e.GetMessage(), filepath.Base(torn)) {
			t.Errorf("entries = %v", got)
		}
	})

	t.Run("monitor conditions", func(t *testing.T) {
		d, _, _ := newDriver(t, heal.ModeRepair, func() []volume.Condition {
			return []volume.Condition{
				{Status: volume.Inaccessible, Reason: "TargetUnreachable", Message: "NVMe/TCP target nqn…a: 2 of 2 endpoints do not answer"},
				{Status: volume.Inaccessible, Reason: "TargetUnreachable", Message: "iSCSI target iqn…b: 1 of 1 portals do not answer"},
				{Status: volume.Degraded, Reason: "ISCSISessionStuck", Message: "session5 …: the target rejects the login"},
			}
		})
		got := entries(t, d)
		want := map[string]string{
			"STORAGE_UNREACHABLE TargetUnreachable": "NVMe/TCP target nqn…a: 2 of 2 endpoints do not answer; iSCSI target iqn…b: 1 of 1 portals do not answer",
			"STORAGE_DEGRADED ISCSISessionStuck":    "session5 …: the target rejects the login",
		}
		gotMsgs := map[string]string{}
		for k, e := range got {
			gotMsgs[k] = e.GetMessage()
		}
		if diff := cmp.Diff(want, gotMsgs); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
}

// nodeModel is a node model whose last tick saw the node's conditions
// conds returns (none when nil).
func nodeModel(conds func() []volume.Condition) *model.Model {
	m := model.New()
	if conds != nil {
		m.Update(func(tx *model.Txn) { tx.SetNode("test", conds()) })
	}
	return m
}
