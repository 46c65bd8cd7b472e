package driver

import (
	"context"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// GetPluginInfo returns the driver name and the version stamped at build
// time.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.DriverName, VendorVersion: d.cfg.Version}, nil
}

// GetPluginCapabilities reports no CONTROLLER_SERVICE: pathmend is a node
// plugin; provisioning belongs to the storage system's own controller.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

// Probe is ready only when the sysfs root can be read (every diagnosis
// depends on it) and the state dir is writable (NodeStage cannot record a
// volume otherwise).
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	ready := true
	if _, err := os.ReadDir(d.deps.SysFS.Root()); err != nil {
		klog.ErrorS(err, "Probe: sysfs root is not readable", "sysRoot", d.deps.SysFS.Root())
		ready = false
	}
	if err := d.deps.Intents.Writable(); err != nil {
		klog.ErrorS(err, "Probe: state dir is not writable")
		ready = false
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(ready)}, nil
}
