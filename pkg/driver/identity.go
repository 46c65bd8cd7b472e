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
// plugin; provisioning belongs to the storage system's own controller. It
// reports VOLUME_ACCESSIBILITY_CONSTRAINTS when a topology segment is
// configured: csi.proto requires it of a plugin whose NodeGetInfo returns
// accessible_topology.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp := &csi.GetPluginCapabilitiesResponse{}
	if d.cfg.TopologyKey != "" {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}},
		})
	}
	return resp, nil
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
