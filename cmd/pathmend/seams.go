package main

import (
	"fmt"

	"k8s.io/utils/clock"

	"github.com/pathmend/pathmend/pkg/blockuse"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/intent"
	"github.com/pathmend/pathmend/pkg/metrics"
	"github.com/pathmend/pathmend/pkg/model"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// nodeSeams are what serve and companion mode build alike from the shared
// flags: the state dir's store and the intent owner over it, the heal
// policy, the rooted sysfs reader, the bounded writer of the kernel
// attributes that can block, the fabrics connector (which writes through
// it), the metrics, the clock and the node model. Each process builds them once.
type nodeSeams struct {
	mode      heal.Mode
	store     *volume.Store
	metrics   *metrics.Metrics
	policy    *heal.Policy
	sys       sysfs.FS
	writer    *sysfs.BoundedWriter
	clk       clock.RealClock
	owner     *intent.Owner
	connector *fabrics.Connector
	// use reads whether a block device is in use on the node, from sysfs
	// and the host's mount table (--host-mountinfo).
	use *blockuse.Reader
	// model is the node model the loop keeps and every health answer
	// reads.
	model *model.Model
}

// newNodeSeams builds the seams from flags c.validate has accepted.
func newNodeSeams(c serveConfig) (*nodeSeams, error) {
	mode, _ := heal.ParseMode(c.heal)
	scope, _ := parseScope(c.healMaxScope)
	store, err := volume.NewStore(c.stateDir)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	m := metrics.New()
	policy, err := heal.NewPolicy(heal.Config{Mode: mode, Grace: c.healGrace, Cooldown: c.healCooldown, MaxScope: scope})
	if err != nil {
		return nil, err
	}
	sys := sysfs.New(c.sysRoot)
	clk := clock.RealClock{}
	owner, err := intent.New(intent.Config{}, intent.Deps{Store: store, Clock: clk, Observer: m})
	if err != nil {
		return nil, err
	}
	writer := sysfs.NewBoundedWriter(sys.WriteAttr, clk, sysfs.DefaultWriteTimeout)
	return &nodeSeams{
		mode: mode, store: store, metrics: m, policy: policy, sys: sys, writer: writer, clk: clk, owner: owner,
		connector: fabrics.NewConnector(c.devRoot, writer),
		use:       blockuse.New(sys, mountTable(c.hostMountInfo)),
		model:     model.New(),
	}, nil
}

// mountTable reads the mount table at path; none when path is empty (then
// every device counts as in use).
func mountTable(path string) blockuse.MountTable {
	if path == "" {
		return nil
	}
	return blockuse.MountInfoFile(path)
}
