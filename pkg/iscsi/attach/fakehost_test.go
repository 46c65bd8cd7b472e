package attach

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// fakeHost is iscsitest's fake iscsid, kernel and multipathd with the
// initiator the attacher drives it through.
type fakeHost struct {
	*iscsitest.Host
	t    *testing.T
	sys  string
	dev  string
	exec *iscsitest.Exec
	in   *iscsi.Initiator
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	host, err := iscsitest.NewHost(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: host.Exec, Sys: sysfs.New(host.Sys), LoginTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeHost{Host: host, t: t, sys: host.Sys, dev: host.Dev, exec: host.Exec, in: in}
}

// attacher returns an Attacher on this host with short waits. Its sysfs
// writes land in the tree's files, where tests read them back.
func (h *fakeHost) attacher(mod func(*AttacherConfig)) *Attacher {
	h.t.Helper()
	cfg := AttacherConfig{
		Sys: sysfs.New(h.sys), DevRoot: h.dev, Initiator: h.in,
		NodeLoginTimeout: time.Second, NodeLoginRetries: 2,
		DeviceTimeout: time.Second, MultipathWait: 100 * time.Millisecond, PollInterval: 5 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := NewAttacher(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	a.checkNode = func(path, devt string) error { // regular files stand in for device nodes
		_, err := os.Stat(path)
		return err
	}
	return a
}

// attachDev attaches and returns the device.
func attachDev(a *Attacher, req volume.AttachRequest) (volume.Device, error) {
	att, err := a.Attach(context.Background(), req)
	return att.Device, err
}

// records are the volumes a test has staged, the co-tenants of the next
// attach or detach.
type records struct {
	mu   sync.Mutex
	list []volume.Record
}

// co returns every record but volumeID's.
func (r *records) co(volumeID string) volume.CoTenants {
	r.mu.Lock()
	defer r.mu.Unlock()
	var co volume.CoTenants
	for _, x := range r.list {
		if x.VolumeID != volumeID {
			co.Records = append(co.Records, x)
		}
	}
	return co
}

func (r *records) add(rec volume.Record) { r.mu.Lock(); r.list = append(r.list, rec); r.mu.Unlock() }

func (r *records) remove(volumeID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = slices.DeleteFunc(r.list, func(x volume.Record) bool { return x.VolumeID == volumeID })
}

const iqn = "iqn.2024-01.io.example:t"

func iscsiVolume(lun int, portals ...string) volume.Context {
	v := &volume.ISCSI{IQN: iqn, LUN: lun}
	for _, p := range portals {
		v.Portals = append(v.Portals, volume.Endpoint{Host: p, Port: 3260})
	}
	return volume.Context{Transport: volume.TransportISCSI, ISCSI: v}
}

func record(id string, c volume.Context, device string) volume.Record {
	return volume.Record{VolumeID: id, State: volume.StateStaged, Context: c, Device: device, AccessType: volume.AccessMount}
}

// readWO reads back what was written to a write-only attribute.
func readWO(t *testing.T, root, rel string) string {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
