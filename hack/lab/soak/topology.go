package main

import (
	"fmt"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/observe"
	"github.com/pathmend/pathmend/hack/lab/soak/plan"
)

// The targets guest/soak_lib.sh builds.
const (
	nqnA  = "nqn.2024-01.io.pathmend.lab:soak-a"
	nqnB  = "nqn.2024-01.io.pathmend.lab:soak-b"
	nqnB2 = "nqn.2024-01.io.pathmend.lab:soak-b2"
	iqnI  = "iqn.2024-01.io.pathmend.lab:soak-i"
	nqnC  = "nqn.2024-01.io.pathmend.lab:soak-c"
	// proxyListen is the flaky proxy in front of TPG 2's portal.
	proxyListen, proxyTarget = "127.0.0.3:3260", "127.0.0.2:3260"
)

// path is one path and how a fault reaches it.
type path struct {
	plan.Path
	group string
	addr  string
	port  int
	// nvmetPort and portNQN: the nvmet port serving the path and the
	// subsystem linked to it (unlinking it breaks the path).
	nvmetPort int
	portNQN   string
	// tpgt is the iSCSI path's target portal group.
	tpgt int
}

// vol is one volume the soak stages.
type vol struct {
	id    string
	group string
	block bool
	// target is its NQN or IQN; context its volume context.
	target  string
	context map[string]string
	spec    observe.VolumeSpec
}

var paths = []path{
	{Path: plan.Path{ID: "a-opt"}, group: "nvme-a", addr: "127.0.0.1", port: 4420, nvmetPort: 1, portNQN: nqnA},
	{Path: plan.Path{ID: "a-nonopt"}, group: "nvme-a", addr: "127.0.0.2", port: 4421, nvmetPort: 2, portNQN: nqnA},
	{Path: plan.Path{ID: "b-direct"}, group: "nvme-b", addr: "127.0.0.1", port: 4422, nvmetPort: 3, portNQN: nqnB},
	{Path: plan.Path{ID: "b-alias", Alias: true}, group: "nvme-b", addr: "127.0.0.3", port: 4423, nvmetPort: 4, portNQN: nqnB2},
	{Path: plan.Path{ID: "i-direct", ISCSI: true}, group: "iscsi", addr: "127.0.0.1", port: 3260, tpgt: 1},
	{Path: plan.Path{ID: "i-proxy", ISCSI: true, Proxy: true}, group: "iscsi", addr: "127.0.0.3", port: 3260, tpgt: 2},
	{Path: plan.Path{ID: "c-opt"}, group: "nvme-c", addr: "127.0.0.1", port: 4424, nvmetPort: 5, portNQN: nqnC},
	{Path: plan.Path{ID: "c-nonopt"}, group: "nvme-c", addr: "127.0.0.2", port: 4425, nvmetPort: 6, portNQN: nqnC},
}

// groups are the plan's groups with the all-paths-down time the plan
// allows: well inside each group's queueing window (subsystem B's
// controllers give up after 30 s, and with them its namespace's head).
// Subsystem C queues for fcQueue only (fast_io_fail_tmo): only the
// filesystem-error fault touches it, taking every path of it down for
// longer.
var groups = []plan.Group{
	{ID: "nvme-a", Window: 60 * time.Second},
	{ID: "nvme-b", Window: 15 * time.Second, CtrlLoss: 30 * time.Second},
	{ID: "iscsi", Window: 45 * time.Second},
	{ID: "nvme-c", Window: 3 * time.Second, FSQueue: fcQueue},
}

// fcQueue is subsystem C's queueing window: its controllers' fast_io_fail_tmo.
const fcQueue = 8 * time.Second

// recommended are the NVMe timeouts pathmend recommends (docs/iscsi.md, "Queueing
// while every path is down"): never give up a controller, fail queued I/O
// after 10 minutes. Subsystem B keeps a short ctrl_loss_tmo instead, so a
// long drop outlasts it.
var recommended = []string{"ctrlLossTmo", "-1", "fastIOFailTmo", "600", "reconnectDelay", "5"}

func nvmeContext(nqn string, nsid string, endpoints, optimized string, extra ...string) map[string]string {
	c := map[string]string{"transport": "nvme-tcp", "nqn": nqn, "nsid": nsid, "endpoints": endpoints, "optimizedEndpoints": optimized}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i]] = extra[i+1]
	}
	return c
}

func volumes() []*vol {
	vs := []*vol{
		{id: "vol-a1", group: "nvme-a", target: nqnA, context: nvmeContext(nqnA, "1", "127.0.0.1:4420,127.0.0.2:4421", "127.0.0.1:4420", recommended...)},
		{id: "vol-a2", group: "nvme-a", target: nqnA, block: true, context: nvmeContext(nqnA, "2", "127.0.0.1:4420,127.0.0.2:4421", "127.0.0.1:4420", recommended...)},
		{id: "vol-b", group: "nvme-b", target: nqnB, context: nvmeContext(nqnB, "1", "127.0.0.1:4422,127.0.0.3:4423", "127.0.0.1:4422", "ctrlLossTmo", "30")},
		{id: "vol-i", group: "iscsi", target: iqnI, context: map[string]string{"transport": "iscsi", "iqn": iqnI, "portals": "127.0.0.1:3260,127.0.0.3:3260", "lun": "0"}},
		{id: "vol-c", group: "nvme-c", target: nqnC, context: nvmeContext(nqnC, "1", "127.0.0.1:4424,127.0.0.2:4425", "127.0.0.1:4424",
			"ctrlLossTmo", "-1", "fastIOFailTmo", fmt.Sprint(int(fcQueue.Seconds())), "reconnectDelay", "2")},
	}
	for _, v := range vs {
		v.spec = observe.VolumeSpec{ID: v.id}
		if v.group == "iscsi" {
			v.spec.IQN, v.spec.LUN = iqnI, 0
		} else {
			v.spec.NQN = v.target
			v.spec.NSID = map[string]uint32{"1": 1, "2": 2}[v.context["nsid"]]
		}
		for _, p := range paths {
			if p.group == v.group {
				v.spec.Paths = append(v.spec.Paths, observe.PathSpec{ID: p.ID, Addr: p.addr, Port: p.port})
			}
		}
	}
	return vs
}

// topology is the plan's view of the lab.
func topology(vs []*vol) plan.Topology {
	var t plan.Topology
	for _, g := range groups {
		for _, p := range paths {
			if p.group == g.ID {
				g.Paths = append(g.Paths, p.Path)
			}
		}
		t.Groups = append(t.Groups, g)
	}
	for _, v := range vs {
		t.Volumes = append(t.Volumes, plan.Volume{ID: v.id, Group: v.group, Block: v.block})
	}
	return t
}

func pathByID(id string) path {
	for _, p := range paths {
		if p.ID == id {
			return p
		}
	}
	return path{}
}
