package nodesim

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/iscsi/attach"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsiheal"
	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/monitor"
	"github.com/pathmend/pathmend/pkg/mounts"
	"github.com/pathmend/pathmend/pkg/mounts/mountstest"
	"github.com/pathmend/pathmend/pkg/nvme"
	nvmeattach "github.com/pathmend/pathmend/pkg/nvme/attach"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/nvme/nvmeheal"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// crash unwinds an actor of a process the scheduler killed.
type crash struct{}

// process is one run of the plugin: everything in it is lost in a crash.
type process struct {
	sim     *sim
	gen     int
	crashed atomic.Bool

	owner   *intent.Owner
	drv     *driver.Driver
	mon     *monitor.Monitor
	model   *model.Model
	iscsi   *attach.Attacher
	actors  atomic.Int32
	mounter *seamMounter
}

// point is a seam: the actor parks until the scheduler lets it through,
// and unwinds when the process was killed meanwhile.
func (p *process) point(what string) {
	if p.crashed.Load() {
		panic(crash{})
	}
	go1 := make(chan bool)
	p.sim.park(p, what, go1)
	if !<-go1 {
		panic(crash{})
	}
}

// start builds a process over the node's kernel, host and state dir.
func (s *sim) start() *process {
	p := &process{sim: s, gen: s.gen}
	s.gen++
	s.forgetEvents()
	store, err := volume.NewStore(s.stateDir)
	if err != nil {
		panic(err)
	}
	p.owner, err = intent.New(intent.Config{}, intent.Deps{Store: seamStore{store, p}, Clock: s.clk, Runner: func(f func()) { f() }})
	if err != nil {
		panic(err)
	}
	policy, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Now: s.clk.Now})
	if err != nil {
		panic(err)
	}
	conn := seamConnector{s.kernel, p}
	nvmeTr, err := nvmeheal.New(nvmeheal.Config{Owned: true}, nvmeheal.Deps{
		SysFS: s.kernel.FS(), Policy: policy, Connector: conn, Host: host, Prober: reachable{}, Clock: s.clk,
	})
	if err != nil {
		panic(err)
	}
	nvmeAtt, err := nvmeattach.NewAttacher(nvmeattach.AttacherConfig{
		SysFS: s.kernel.FS(), DevRoot: "/dev", Connector: conn, Host: host, Mender: nvmeTr,
		AttachWait: time.Second, Poll: 50 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	ex := &iscsitest.Exec{Handler: func(ctx context.Context, argv []string) iscsitest.Result {
		p.point(fmt.Sprint(argv))
		s.iscsiadm(argv)
		defer s.changed(false, true)
		return s.host.Exec.Handler(ctx, argv)
	}}
	w := seamWriter{s.host, p}
	in, err := iscsi.NewInitiator(iscsi.InitiatorConfig{Exec: ex, Sys: sysfs.New(s.host.Sys), Writer: w, LoginConcurrency: 1, LoginTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	p.iscsi, err = attach.NewAttacher(attach.AttacherConfig{
		Sys: sysfs.New(s.host.Sys), Writer: w, DevRoot: s.host.Dev, Initiator: in,
		NodeLoginTimeout: time.Second, NodeLoginRetries: 2,
		DeviceTimeout: 5 * time.Second, MultipathWait: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		VerifyNode: func(path, _ string) error { _, err := os.Stat(path); return err },
	})
	if err != nil {
		panic(err)
	}
	p.mounter = &seamMounter{Table: s.mounts, p: p}
	tools := &iscsitest.Exec{Handler: func(_ context.Context, argv []string) iscsitest.Result {
		if argv[0] == "blkid" {
			return iscsitest.Result{Out: "TYPE=ext4\n"}
		}
		return iscsitest.Result{}
	}}
	rec, err := intent.NewReconciler(intent.ReconcilerConfig{Timeout: 5 * time.Minute}, intent.ReconcilerDeps{
		Owner: p.owner, Mounts: s.mounts, SysFS: s.kernel.FS(), Clock: s.clk,
		Detachers: map[volume.Transport]intent.Detacher{volume.TransportNVMeTCP: nvmeAtt, volume.TransportISCSI: p.iscsi},
	})
	if err != nil {
		panic(err)
	}
	healer, err := iscsi.NewSessionHealer(iscsi.HealerConfig{
		Policy: policy, Threshold: 45 * time.Second, Kicker: in, Prober: reachable{}, Now: s.clk.Now,
	})
	if err != nil {
		panic(err)
	}
	iscsiTr, err := iscsiheal.New(iscsiheal.Deps{SysFS: sysfs.New(s.host.Sys), Healer: healer, Clock: s.clk})
	if err != nil {
		panic(err)
	}
	p.model = model.New()
	loop := monitor.Config{}
	p.drv, err = driver.New(driver.Config{DriverName: "csi.pathmend.io", Version: "sim", NodeID: "node-1", HealMode: heal.ModeRepair, DefaultFSType: "ext4",
		HealthBound: loop.Bound()},
		driver.Deps{
			SysFS: s.kernel.FS(), Intents: p.owner, Exec: tools,
			Mounter:   &mount.SafeFormatAndMount{Interface: p.mounter, Exec: tools},
			Attachers: map[volume.Transport]driver.Attacher{volume.TransportNVMeTCP: nvmeAtt, volume.TransportISCSI: p.iscsi},
			Clock:     s.clk,
			Model:     p.model,
			MountInfo: s.mounts.MountInfo, UnmountLayer: p.mounter.UnmountLayer, MountNamespace: s.mounts.Namespace,
		})
	if err != nil {
		panic(err)
	}
	p.mon, err = monitor.New(loop, monitor.Deps{
		Intents: p.owner, Reconciler: rec, Policy: policy, Transports: []monitor.Transport{nvmeTr, iscsiTr}, Model: p.model,
		Clock: s.clk, SysFS: s.kernel.FS(), PathExists: func(string) bool { return true },
	})
	if err != nil {
		panic(err)
	}
	return p
}

var host = fabrics.HostIdentity{NQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa"}

// reachable answers every probe, NVMe's and iSCSI's: the fabric is up;
// faults act on the kernel's side.
type reachable struct{}

func (reachable) Reachable(context.Context, string) error { return nil }

func (reachable) Probe(context.Context, volume.Endpoint) iscsi.Reachability {
	return iscsi.Reachability{ICMP: iscsi.ICMPReply}
}

// seamStore makes every record write a seam.
type seamStore struct {
	*volume.Store
	p *process
}

func (s seamStore) Put(r volume.Record) error {
	s.p.point(fmt.Sprintf("put %s %s", r.VolumeID, r.State))
	defer s.p.sim.changed(true, false)
	return s.Store.Put(r)
}

func (s seamStore) Delete(id string) error {
	s.p.point("delete record " + id)
	defer s.p.sim.changed(true, false)
	return s.Store.Delete(id)
}

// seamConnector makes every fabrics operation a seam.
type seamConnector struct {
	k nvme.Connector
	p *process
}

func (c seamConnector) Connect(ctx context.Context, o fabrics.Options) (fabrics.Result, error) {
	what := fmt.Sprintf("connect %s %s:%s", o.NQN, o.Traddr, o.Trsvcid)
	c.p.point(what)
	if !c.p.sim.needs(volume.Target{Transport: volume.TransportNVMeTCP, Name: o.NQN}, o.Traddr+":"+o.Trsvcid) {
		c.p.sim.violation("%s: no attaching or staged record lists it", what)
	}
	return c.k.Connect(ctx, o)
}

func (c seamConnector) Disconnect(ctrl string) error {
	c.p.point("disconnect " + ctrl)
	if nqn, err := c.p.sim.kernel.FS().ReadAttr("class/nvme/" + ctrl + "/subsysnqn"); err == nil {
		c.p.sim.teardown(volume.Target{Transport: volume.TransportNVMeTCP, Name: nqn}, "disconnect "+ctrl)
	}
	return c.k.Disconnect(ctrl)
}

func (c seamConnector) Rescan(ctrl string) error {
	c.p.point("rescan " + ctrl)
	return c.k.Rescan(ctrl)
}

// seamWriter makes every sysfs write of the iSCSI side a seam.
type seamWriter struct {
	h *iscsitest.Host
	p *process
}

func (w seamWriter) WriteAttr(rel, value string) error {
	w.p.point("write " + rel)
	defer w.p.sim.changed(false, true)
	return w.h.WriteAttr(rel, value)
}

// seamMounter makes every mount and unmount a seam; the mount table is
// the node's, shared by every process.
type seamMounter struct {
	*mountstest.Table
	p *process
}

func (m *seamMounter) Mount(source, target, fstype string, options []string) error {
	m.p.point("mount " + target)
	return m.Table.Mount(source, target, fstype, options)
}

func (m *seamMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	m.p.point("mount " + target)
	return m.Table.MountSensitive(source, target, fstype, options, sensitive)
}

func (m *seamMounter) Unmount(target string) error {
	m.p.point("unmount " + target)
	return m.Table.Unmount(target)
}

func (m *seamMounter) UnmountLayer(l mounts.Layer) error {
	m.p.point("unmount " + l.MountPoint)
	return m.Table.UnmountLayer(l)
}

// iscsiadm checks an iscsiadm command the scheduler let through: a
// login or a new node record needs an attaching or staged record listing
// the portal; a logout or a deleted node record is a teardown.
func (s *sim) iscsiadm(argv []string) {
	t := volume.Target{Transport: volume.TransportISCSI, Name: iqnT}
	portal := ""
	if i := slices.Index(argv, "-p"); i >= 0 && i+1 < len(argv) {
		portal = argv[i+1]
	}
	switch {
	case iscsitest.Has(argv, "--login"), iscsitest.Has(argv, "-o", "new"):
		if !s.needs(t, portal) {
			s.violation("%v: no attaching or staged record lists %s", argv, portal)
		}
	case iscsitest.Has(argv, "-m", "session", "-u"), iscsitest.Has(argv, "-o", "delete"):
		s.teardown(t, fmt.Sprint(argv))
	}
}
